"""Chapter 3: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # math.ceil instead of negative floor division, and a list instead of a tuple
    "3.1": '''
import math
shard = max(1, math.ceil(numel / world_size))
return [rank * shard, (rank + 1) * shard]
''',
    # no flat buffer kept: the layout only, a fresh padded gradient and parameter buffer every step, the mean taken
    # by the collective (op="avg"), Adam on a copy of the shard, the gathered buffer copied back into the parameters
    "3.3": '''
def __init__(self, params, adam, rank, world_size):
    from zero_ref.stages.flat import FlatLayout
    self.params = list(params)
    self.cfg, self.rank = adam, rank
    self.layout = FlatLayout([p.shape for p in self.params], world_size)
    self.exp_avg = torch.zeros(self.layout.shard_numel)
    self.exp_avg_sq = torch.zeros_like(self.exp_avg)
    self.t = 0

@torch.no_grad()
def step(self):
    flat_grad = self.layout.flatten([p.grad for p in self.params])
    lo, hi = self.layout.shard_range(self.rank)
    mean_grad = torch.empty(hi - lo)
    comm.reduce_scatter(mean_grad, flat_grad, op="avg")
    shard = self.layout.flatten([p.detach() for p in self.params])[lo:hi].clone()
    self.t += 1
    adam_step_(shard, mean_grad, self.exp_avg, self.exp_avg_sq, self.t, self.cfg)
    full = torch.empty(self.layout.padded_numel)
    comm.all_gather(full, shard)
    for p, new in zip(self.params, self.layout.unflatten(full)):
        p.copy_(new)
''',
}

WRONG = {
    # shard_start measured from the start of the buffer instead of the start of the shard
    "3.2": '''
shard = max(1, -(-sum(numels) // world_size))
lo, hi = rank * shard, (rank + 1) * shard
out, offset = [], 0
for i, n in enumerate(numels):
    a, b = max(lo, offset), min(hi, offset + n)
    if a < b:
        out.append((i, a - offset, b - offset, a))
    offset += n
return out
''',
}
