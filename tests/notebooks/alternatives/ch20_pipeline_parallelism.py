"""Chapter 20: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # closed-form counts instead of walking the orders: 1F1B and interleaved hold warm-up + 1 (chunk) micro-batches,
    # GPipe all m, each priced at the heavier of the stage's chunks; micro-batch counts smallest first; a list
    "20.1": '''
best, best_bubble = None, 1.0
for m in [d for d in range(1, batch + 1) if batch % d == 0 and batch // d >= min_micro]:
    n = batch // m
    for schedule, v in (("1f1b", 1), ("interleaved", 2), ("gpipe", 1)):
        if v > 1 and m % p:
            continue
        held = [m if schedule == "gpipe" else min(warmup_count(schedule, p, m, s, v) + 1, v * m) for s in range(p)]
        if all(h * n * max(seq_bytes[v][s]) <= budget for s, h in enumerate(held)):
            bubble = (p - 1) / (v * m + p - 1)
            if bubble < best_bubble:
                best, best_bubble = [schedule, v, m], bubble
return best
''',
    # driven by stage_order's 1F1B order, a dict of held micro-batches, irecv + wait, grads sent blocking-free
    "20.2": '''
from zero_ref.parallel.schedules import stage_order

m = len(micro_batches)
held, handles, losses = {}, [], []
for kind, i, _ in stage_order("1f1b", p, m, s):
    if kind == "F":
        if s == 0:
            x = micro_batches[i][0]
        else:
            x = torch.zeros(shape)
            comm.irecv(x, s - 1).wait()
            x.requires_grad = True
        if s == p - 1:
            out = stage(x, micro_batches[i][1])
            losses.append(out.item())
            out = out / m
        else:
            out = stage(x)
            handles.append(comm.isend(out.detach().clone(), s + 1))
        held[i] = (x, out)
    else:
        x, out = held.pop(i)
        if s == p - 1:
            out.backward()
        else:
            g = torch.zeros(shape)
            comm.irecv(g, s + 1).wait()
            out.backward(g)
        if s > 0:
            handles.append(comm.isend(x.grad.clone(), s - 1))
for h in handles:
    h.wait()
return losses
''',
    # ZB-H1 built on 1F1B's order: each B owes a W, paid at once after the first s backwards, the rest at the end
    "20.3": '''
from zero_ref.parallel.schedules import stage_order

ops, owed = [], []
for kind, i, _ in stage_order("1f1b", p, m, s):
    ops.append([kind, i, 0])
    if kind == "B":
        owed.append(i)
        if sum(op[0] == "B" for op in ops) > s:
            ops.append(["W", owed.pop(0), 0])
return ops + [["W", i, 0] for i in owed]
''',
}


_PLAN = '''
def peak(schedule, v, m, s):
    held = top = 0
    for kind, _, c in stage_order(schedule, p, m, s, v):
        held += (1 if kind == "F" else -1) * {size} * seq_bytes[v][s][c]
        top = max(top, held)
    return top

best = None
for schedule, v in {schedules}:
    for m in range(1, batch // min_micro + 1):
        if batch % m or m % (p if v > 1 else 1):
            continue
        bubble = (p - 1) / (v * m + p - 1)
        if (best is None or bubble < best[0]) and all(peak(schedule, v, m, s) <= budget for s in {stages}):
            best = (bubble, (schedule, v, m))
return best[1] if best else None
'''
_FULL = dict(size="(batch // m)", schedules=(("gpipe", 1), ("1f1b", 1), ("interleaved", 2)), stages="range(p)")

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # a constant: the plan with the smallest bubble, whatever the budget
    {"20.1": '''
return ("interleaved", 2, batch)
'''},
    # only stage 0 checked: GPipe at m = 1 fits there, but the last stage (the head) holds more than the budget
    {"20.1": _PLAN.format(**{**_FULL, "stages": "range(1)"})},
    # bytes per micro-batch taken as one sequence's: the micro-batch size ignored, too much held at small m
    {"20.1": _PLAN.format(**{**_FULL, "size": "1"})},
    # 1F1B only: never considers interleaving, which fits some budgets with a smaller bubble
    {"20.1": _PLAN.format(**{**_FULL, "schedules": (("1f1b", 1),)})},
    # the right order, but blocking sends: in the steady state stage s sends an activation to s + 1 while s + 1
    # sends a gradient to s, each waits for the other's receive (the check's 30 s timeout fails it)
    {"20.2": '''
m, first, last = len(micro_batches), s == 0, s == p - 1
held, losses = deque(), []

def forward(i):
    idx, targets = micro_batches[i]
    if first:
        x = idx
    else:
        x = torch.empty(shape)
        comm.recv(x, s - 1)
        x.requires_grad_()
    out = stage(x, targets if last else None)
    if last:
        losses.append(out.item())
        out = out / m
    else:
        comm.send(out.detach(), s + 1)
    held.append((x, out))

def backward():
    x, out = held.popleft()
    grad = None
    if not last:
        grad = torch.empty(shape)
        comm.recv(grad, s + 1)
    torch.autograd.backward(out, grad)
    if not first:
        comm.send(x.grad, s - 1)

warmup = min(p - s - 1, m)
for i in range(warmup):
    forward(i)
for i in range(warmup, m):
    forward(i)
    backward()
for _ in range(warmup):
    backward()
return losses
'''},
    # GPipe's order (all forwards, then the backwards last micro-batch first): the same losses and gradients,
    # without a deadlock, but each stage holds all m micro-batches; the order check fails it
    {"20.2": '''
m, first, last = len(micro_batches), s == 0, s == p - 1
held, sends, losses = {}, [], []
for i in range(m):
    idx, targets = micro_batches[i]
    if first:
        x = idx
    else:
        x = torch.empty(shape)
        comm.recv(x, s - 1)
        x.requires_grad_()
    out = stage(x, targets if last else None)
    if last:
        losses.append(out.item())
        out = out / m
    else:
        sends.append((comm.isend(out.detach(), s + 1), out))
    held[i] = (x, out)
for i in reversed(range(m)):
    x, out = held.pop(i)
    grad = None
    if not last:
        grad = torch.empty(shape)
        comm.recv(grad, s + 1)
    torch.autograd.backward(out, grad)
    if not first:
        sends.append((comm.isend(x.grad, s - 1), x.grad))
for work, _ in sends:
    work.wait()
return losses
'''},
    # runs every W right after its B: no W left for the cool-down, so the bubble is 1F1B's
    {"20.3": '''
warmup = min(p - s - 1, m)
ops = [("F", i, 0) for i in range(warmup)]
for k in range(m):
    if warmup + k < m:
        ops.append(("F", warmup + k, 0))
    ops += [("B", k, 0), ("W", k, 0)]
return ops
'''},
    # defers the W's on the wrong stages: p − 1 − s of them (stage 0 most), where the cool-down has no room
    {"20.3": '''
warmup, defer = min(p - s - 1, m), p - 1 - s
ops, w = [("F", i, 0) for i in range(warmup)], 0
for k in range(m):
    if warmup + k < m:
        ops.append(("F", warmup + k, 0))
    ops.append(("B", k, 0))
    if k >= defer:
        ops.append(("W", w, 0))
        w += 1
return ops + [("W", i, 0) for i in range(w, m)]
'''},
]
