"""Chapter 16: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG, MORE_WRONG
must fail)."""

RIGHT = {
    # walk the accumulation steps instead of the micro-batch sizes, keep every candidate, take the min
    "16.1": '''
groups = tp * pp
if world % groups != 0:
    raise ValueError("no rank grid")
dp = world // groups
per_rank = global_batch / dp
candidates = []
for gas in range(1, global_batch + 1):
    micro = per_rank / gas
    if micro == int(micro) and 1 <= micro <= max_micro:
        micro = int(micro)
        candidates.append(((gas + pp - 1) * (t_fixed + micro * t_sample), micro, gas))
if not candidates:
    raise ValueError("no valid layout")
_, micro, gas = min(candidates)
return micro, gas
''',
}

WRONG = {
    # each micro-batch weighted by its share of the tokens, forgetting that backward divides by GAS
    "16.2": '''
total = sum(token_counts)
return [n / total for n in token_counts]
''',
}

# Task 16.3: the mean of the micro-batch losses in one backward, one all-reduce per parameter
RIGHT["16.3"] = '''
torch.stack([model(i, t)[1] for i, t in micro_batches]).mean().backward()
for p in model.parameters():
    comm.all_reduce(p.grad, group=group)
    p.grad /= comm.get_world_size(group)
optimizer.step()
optimizer.zero_grad(set_to_none=True)
'''

_CHOOSE = '''
if world % (tp * pp):
    raise ValueError("no rank grid")
dp = {dp}
best = None
for micro in range(1, {max_micro} + 1):
    if global_batch % (micro * dp):
        continue
    gas = global_batch // (micro * dp)
    time = {time}
    if best is None or time < best[0]:
        best = (time, micro, gas)
if best is None:
    raise ValueError("no layout")
return best[1], best[2]
'''
_RIGHT = dict(dp="world // (tp * pp)", max_micro="max_micro", time="(gas + pp - 1) * (t_fixed + micro * t_sample)")

MORE_WRONG = [
    # dp taken to be the world size: the TP and PP ranks counted as data-parallel replicas
    {"16.1": _CHOOSE.format(**{**_RIGHT, "dp": "world"}),
     # the summed gradients never divided by the number of ranks
     "16.3": '''
for idx, targets in micro_batches:
    (model(idx, targets)[1] / len(micro_batches)).backward()
for p in model.parameters():
    comm.all_reduce(p.grad, group=group)
optimizer.step()
optimizer.zero_grad()
'''},
    # the pipeline bubble left out: gas slots instead of gas + pp − 1
    {"16.1": _CHOOSE.format(**{**_RIGHT, "time": "gas * (t_fixed + micro * t_sample)"}),
     # the loss not divided by GAS: the gradient of the sum of the micro-batch means
     "16.3": '''
for idx, targets in micro_batches:
    model(idx, targets)[1].backward()
for p in model.parameters():
    comm.all_reduce(p.grad, group=group)
    p.grad /= comm.get_world_size(group)
optimizer.step()
optimizer.zero_grad()
'''},
    # the memory limit ignored: any micro-batch that divides the batch
    {"16.1": _CHOOSE.format(**{**_RIGHT, "max_micro": "global_batch"})},
]
