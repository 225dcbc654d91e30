"""Chapter 13: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # unpacked state, integer halving (2**k // 2), a fresh dict built at the end
    "13.1": '''
scale, left, it, last = state["scale"], state["hysteresis"], state["iter"], state["last_overflow"]
if overflow:
    last = it
    if min(hysteresis, left) > 1:
        left -= 1
    else:
        scale = max(scale // 2, min_scale)
else:
    stable = it - last - 1
    if stable > 0 and stable % window == 0:
        scale, left = scale * 2, hysteresis
return {"scale": scale, "hysteresis": left, "iter": it + 1, "last_overflow": last}
''',
}

WRONG = {
    # overflow checked on this rank's own fp16 gradients only: the rank that sees the inf skips, the other steps
    "13.3": '''
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
''',
    # compares with 65504 instead of casting: misses the values that round down to 65504
    "13.2": '''
k = math.floor(math.log2(torch.finfo(torch.float16).max / grad.abs().max().item()))
return 2.0 ** k
''',
}
