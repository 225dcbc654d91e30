"""Chapter 13: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # patterns built from the settings, as 0/1 integers (the check takes anything bool() reads)
    "13.1": '''
PATTERNS = dict(no_minus_one=[0] * WINDOW, refill_every_step=[1, 0, 1])
''',
    # state in a dict, padding with F.pad, the inverse scale multiplied, and two all-reduces (flag max, Σg² sum)
    "13.3": '''
import torch.nn.functional as nnf
from zero_ref import comm
from zero_ref.optim import adam_step_

ps = list(model.parameters())
sizes = [p.numel() for p in ps]
n = sum(sizes)
size = (n + world_size - 1) // world_size
st = {"adam_steps": 0}
full32 = nnf.pad(torch.cat([p.detach().reshape(-1).float() for p in ps]), (0, size * world_size - n))
st["master"] = full32.narrow(0, rank * size, size).clone()
st["m"], st["v"] = torch.zeros(size), torch.zeros(size)
for p in ps:
    p.data = p.data.half()

def backward(loss):
    scaled = loss * scaler.loss_scale
    scaled.backward()

def step():
    g16 = nnf.pad(torch.cat([p.grad.reshape(-1) for p in ps]), (0, size * world_size - n))
    for p in ps:
        p.grad = None
    out = torch.zeros(size, dtype=torch.float16)
    comm.reduce_scatter(out, g16)
    g = out.float() * (1.0 / (world_size * scaler.loss_scale))
    bad = torch.tensor([0.0 if torch.isfinite(g).all() else 1.0])
    comm.all_reduce(bad, op="max")
    sq = torch.linalg.vector_norm(g).double().pow(2).reshape(1)
    comm.all_reduce(sq)
    overflow = bad.item() > 0 or not math.isfinite(sq.item())
    scaler.update_scale(overflow)
    if overflow:
        return False, float("inf")
    st["adam_steps"] += 1
    adam_step_(st["master"], g, st["m"], st["v"], st["adam_steps"], adam)
    parts = [torch.empty(size, dtype=torch.float16) for _ in range(world_size)]
    comm.all_gather(parts, st["master"].to(torch.float16))
    flat16 = torch.cat(parts)
    offset = 0
    for p, k in zip(ps, sizes):
        p.data.copy_(flat16[offset:offset + k].view_as(p))
        offset += k
    return True, sq.item() ** 0.5
''',
}

WRONG = {
    # compares with 65504 instead of casting: misses the values that round down to 65504
    "13.2": '''
k = math.floor(math.log2(torch.finfo(torch.float16).max / grad.abs().max().item()))
return 2.0 ** k
''',
}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # 13.1 off by one: two clean steps, where the misreading's stable is 2 < W and DeepSpeed's 1: the same scales
    {"13.1": '''
PATTERNS = {"no_minus_one": [False, False], "refill_every_step": [True, False, True]}
'''},
    # overflow checked on this rank's own fp16 gradients only: the rank that sees the inf skips, the other steps;
    # and 13.1's refill told apart by the hysteresis counter alone ([True, False]): the scales are the same
    {"13.1": '''
PATTERNS = {"no_minus_one": [False, False, False], "refill_every_step": [True, False]}
''', "13.3": '''
from zero_ref import comm
from zero_ref.optim import adam_step_

params = list(model.parameters())
numel = sum(p.numel() for p in params)
shard = -(-numel // world_size)
pad = shard * world_size - numel

def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors] + [tensors[0].new_zeros(pad)])

master = flat([p.detach().float() for p in params])[rank * shard:(rank + 1) * shard].clone()
exp_avg, exp_avg_sq = torch.zeros(shard), torch.zeros(shard)
applied = [0]
model.half()

def backward(loss):
    (loss * scaler.loss_scale).backward()

def step():
    if not all(torch.isfinite(p.grad).all() for p in params):
        for p in params:
            p.grad = None
        scaler.update_scale(True)
        return False, math.inf
    summed = torch.empty(shard, dtype=torch.float16)
    comm.reduce_scatter(summed, flat([p.grad for p in params]))
    for p in params:
        p.grad = None
    grad = summed.float() / world_size / scaler.loss_scale
    sq = grad.double().square().sum().reshape(1)
    comm.all_reduce(sq)
    scaler.update_scale(False)
    applied[0] += 1
    adam_step_(master, grad, exp_avg, exp_avg_sq, applied[0], adam)
    gathered = torch.empty(shard * world_size, dtype=torch.float16)
    comm.all_gather(gathered, master.half())
    with torch.no_grad():
        for p, values in zip(params, gathered[:numel].split([p.numel() for p in params])):
            p.copy_(values.view_as(p))
    return True, math.sqrt(sq.item())
'''},
    # the gradient left scaled by the loss scale: Adam's step barely changes (nearly scale-free), but the
    # overflow test and the gradient norm see 2^8 times the gradient (the norm check fails it);
    # and 13.1's no_minus_one with a pattern that tells them apart but is not the shortest
    {"13.1": '''
PATTERNS = {"no_minus_one": [False, False, False, False], "refill_every_step": [True, False, True]}
''', "13.3": '''
from zero_ref import comm
from zero_ref.optim import adam_step_

params = [p for p in model.parameters() if p.requires_grad]
numel = sum(p.numel() for p in params)
shard = -(-numel // world_size)
pad = shard * world_size - numel

def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors] + [tensors[0].new_zeros(pad)])

master = flat([p.detach().float() for p in params])[rank * shard:(rank + 1) * shard].clone()
exp_avg, exp_avg_sq = torch.zeros(shard), torch.zeros(shard)
applied = [0]
model.half()

def backward(loss):
    (loss * scaler.loss_scale).backward()

def step():
    summed = torch.empty(shard, dtype=torch.float16)
    comm.reduce_scatter(summed, flat([p.grad for p in params]))
    for p in params:
        p.grad = None
    grad = summed.float() / world_size
    both = torch.stack([grad.double().square().sum(),
                        torch.tensor(float(not torch.isfinite(grad).all()), dtype=torch.float64)])
    comm.all_reduce(both)
    overflow = bool(both[1] > 0) or not math.isfinite(both[0].item())
    scaler.update_scale(overflow)
    if overflow:
        return False, math.inf
    applied[0] += 1
    adam_step_(master, grad, exp_avg, exp_avg_sq, applied[0], adam)
    gathered = torch.empty(shard * world_size, dtype=torch.float16)
    comm.all_gather(gathered, master.half())
    with torch.no_grad():
        for p, values in zip(params, gathered[:numel].split([p.numel() for p in params])):
            p.copy_(values.view_as(p))
    return True, math.sqrt(both[0].item())
'''},
]

# DDP-style 13.3: the whole gradient all-reduced, a full fp32 master and full moments on every rank; the numbers
# match ZeroStage2's, the collectives do not (no reduce-scatter, an all-reduce of the whole gradient)
MORE_WRONG.append({"13.3": '''
from zero_ref import comm
from zero_ref.optim import adam_step_

params = list(model.parameters())
master = torch.cat([p.detach().float().reshape(-1) for p in params])
exp_avg, exp_avg_sq = torch.zeros_like(master), torch.zeros_like(master)
applied = [0]
model.half()

def backward(loss):
    (loss * scaler.loss_scale).backward()

def step():
    summed = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    comm.all_reduce(summed)
    grad = summed.float() / world_size / scaler.loss_scale
    overflow = not bool(torch.isfinite(grad).all())
    scaler.update_scale(overflow)
    if overflow:
        return False, math.inf
    applied[0] += 1
    adam_step_(master, grad, exp_avg, exp_avg_sq, applied[0], adam)
    with torch.no_grad():
        for p, values in zip(params, master.half().split([p.numel() for p in params])):
            p.copy_(values.view_as(p))
    return True, grad.double().norm().item()
'''})
