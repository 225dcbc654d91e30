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

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # the reduce-scattered gradient is the sum over ranks, not the mean: Adam's update barely changes (it is
    # nearly scale-free) but m and v are 2× and 4× torch's; the moment check fails it
    {"3.3": '''
def __init__(self, params, adam, rank, world_size):
    self.params, self.adam, self.rank, self.world_size = list(params), adam, rank, world_size
    numel = sum(p.numel() for p in self.params)
    self.shard = -(-numel // world_size)
    self.flat = torch.zeros(self.shard * world_size)
    offset = 0
    for p in self.params:
        view = self.flat[offset:offset + p.numel()].view_as(p)
        view.copy_(p.data)
        p.data = view
        offset += p.numel()
    self.exp_avg = torch.zeros(self.shard)
    self.exp_avg_sq = torch.zeros(self.shard)
    self.steps = 0

def step(self):
    flat_grad = torch.zeros_like(self.flat)
    offset = 0
    for p in self.params:
        flat_grad[offset:offset + p.numel()].copy_(p.grad.flatten())
        offset += p.numel()
    grad = torch.empty(self.shard)
    comm.reduce_scatter(grad, flat_grad)
    lo = self.rank * self.shard
    mine = self.flat[lo:lo + self.shard]
    self.steps += 1
    adam_step_(mine, grad, self.exp_avg, self.exp_avg_sq, self.steps, self.adam)
    comm.all_gather(self.flat, mine.clone())
'''},
    # plain data parallelism: all-reduce the whole gradient and step the whole buffer with full-size moments;
    # the parameters are right, but each rank holds 8 × Ψ bytes of state (the shard-size check fails it)
    {"3.3": '''
def __init__(self, params, adam, rank, world_size):
    self.params, self.adam, self.world_size = list(params), adam, world_size
    self.flat = torch.cat([p.detach().flatten() for p in self.params])
    offset = 0
    for p in self.params:
        p.data = self.flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    self.exp_avg = torch.zeros_like(self.flat)
    self.exp_avg_sq = torch.zeros_like(self.flat)
    self.steps = 0

def step(self):
    grad = torch.cat([p.grad.flatten() for p in self.params])
    comm.all_reduce(grad)
    grad.div_(self.world_size)
    self.steps += 1
    adam_step_(self.flat, grad, self.exp_avg, self.exp_avg_sq, self.steps, self.adam)
'''},
]
