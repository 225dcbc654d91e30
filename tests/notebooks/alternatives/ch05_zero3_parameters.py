"""Chapter 5: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # exact rational arithmetic, the three equal entries built by one comprehension
    "5.1": '''
from fractions import Fraction
each = Fraction(n - 1, n) * psi * bytes_per_param
return {key: each for key in ("forward all_gather", "backward all_gather", "reduce_scatter")}
''',
    # the layout from zero_ref's FlatLayout; backward recomputes the layer under autograd on a freshly gathered
    # buffer (its gradient is the flat gradient, padding included) and lets the collective take the mean (op="avg")
    "5.3": '''
def __init__(self, linear, rank, world_size):
    from zero_ref.stages.flat import FlatLayout
    super().__init__()
    self.layout = FlatLayout([linear.weight.shape, linear.bias.shape], world_size)
    self.rank = rank
    full = self.layout.flatten([linear.weight.detach(), linear.bias.detach()])
    self.shard = torch.nn.Parameter(self.layout.shard(full, rank).clone())

def gathered(self):
    full = torch.empty(self.layout.padded_numel)
    comm.all_gather(full, self.shard.detach())
    return full

class Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, layer):
        weight, bias = layer.layout.unflatten(layer.gathered())
        ctx.layer = layer
        ctx.save_for_backward(x)
        return x @ weight.T + bias

    @staticmethod
    def backward(ctx, grad_out):
        layer, (x,) = ctx.layer, ctx.saved_tensors
        # recompute the layer under autograd on a freshly gathered buffer: its gradient is the flat gradient
        with torch.enable_grad():
            full = layer.gathered().requires_grad_()
            x = x.detach().requires_grad_()
            weight, bias = layer.layout.unflatten(full)
            grad_x, grad_full = torch.autograd.grad(x @ weight.T + bias, (x, full), grad_out)
        grad_shard = torch.empty_like(layer.shard)
        comm.reduce_scatter(grad_shard, grad_full, op="avg")
        return grad_x, grad_shard, None

def forward(self, x):
    return self.Fn.apply(x, self.shard, self)
''',
}

WRONG = {
    # every rank writes its shard into a zero buffer and all-reduces it: the right values, but twice the
    # traffic of an all-gather (an all-reduce sends 2(N-1)/N of the buffer)
    "5.2": '''
import torch.distributed as dist
full = part.new_zeros(world_size * part.numel())
rank = dist.get_rank()
full[rank * part.numel():(rank + 1) * part.numel()] = part
comm.all_reduce(full)
return full
''',
}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # the gathered weight saved for backward: the right gradients, but every layer's full weight stays alive from
    # its forward to its backward (the "nothing gathered after forward" check fails it)
    {"5.3": '''
def __init__(self, linear, rank, world_size):
    super().__init__()
    self.shapes = (linear.weight.shape, linear.bias.shape)
    self.world_size = world_size
    flat = torch.cat([linear.weight.detach().flatten(), linear.bias.detach().flatten()])
    self.numel, s = flat.numel(), -(-flat.numel() // world_size)
    flat = torch.nn.functional.pad(flat, (0, s * world_size - self.numel))
    self.shard = torch.nn.Parameter(flat[rank * s:(rank + 1) * s].clone())

def gather(self):
    full = torch.empty(self.shard.numel() * self.world_size)
    comm.all_gather(full, self.shard.detach())
    n = self.shapes[0].numel()
    return full[:n].view(self.shapes[0]), full[n:self.numel]

class Gathered(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, layer):
        weight, bias = layer.gather()
        ctx.save_for_backward(x, weight)
        ctx.layer = layer
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x, weight), layer = ctx.saved_tensors, ctx.layer
        flat_grad = torch.zeros(layer.shard.numel() * layer.world_size)
        n = weight.numel()
        flat_grad[:n] = (grad_out.T @ x).flatten()
        flat_grad[n:layer.numel] = grad_out.sum(0)
        grad_shard = torch.empty(layer.shard.numel())
        comm.reduce_scatter(grad_shard, flat_grad)
        return grad_out @ weight, grad_shard / layer.world_size, None

def forward(self, x):
    return self.Gathered.apply(x, self.shard, self)
'''},
    # the flat gradient all-reduced and a slice kept as the shard's gradient: the right values, but an
    # all-reduce sends twice what a reduce-scatter does (the backward collectives check fails it)
    {"5.3": '''
def __init__(self, linear, rank, world_size):
    super().__init__()
    self.shapes = (linear.weight.shape, linear.bias.shape)
    self.rank, self.world_size = rank, world_size
    flat = torch.cat([linear.weight.detach().flatten(), linear.bias.detach().flatten()])
    self.numel, s = flat.numel(), -(-flat.numel() // world_size)
    flat = torch.nn.functional.pad(flat, (0, s * world_size - self.numel))
    self.shard = torch.nn.Parameter(flat[rank * s:(rank + 1) * s].clone())

def gather(self):
    full = torch.empty(self.shard.numel() * self.world_size)
    comm.all_gather(full, self.shard.detach())
    n = self.shapes[0].numel()
    return full[:n].view(self.shapes[0]), full[n:self.numel]

class Gathered(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, layer):
        weight, bias = layer.gather()
        ctx.save_for_backward(x)
        ctx.layer = layer
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,), layer = ctx.saved_tensors, ctx.layer
        weight, _ = layer.gather()
        s = layer.shard.numel()
        flat_grad = torch.zeros(s * layer.world_size)
        n = weight.numel()
        flat_grad[:n] = (grad_out.T @ x).flatten()
        flat_grad[n:layer.numel] = grad_out.sum(0)
        comm.all_reduce(flat_grad)
        grad_shard = flat_grad[layer.rank * s:(layer.rank + 1) * s].clone() / layer.world_size
        return grad_out @ weight, grad_shard, None

def forward(self, x):
    return self.Gathered.apply(x, self.shard, self)
'''},
]

# Task 5.4 (hpZ): a correct answer in another style: the node groups listed first, the slice by torch.chunk,
# the state as one optional tensor per source
RIGHT["5.4"] = '''
def __init__(self, primary, g):
    world = dist.get_world_size()
    nodes = [list(range(world))[i:i + g] for i in range(0, world, g)]
    groups = [comm.new_group(ranks) for ranks in nodes]
    self.me = dist.get_rank()
    self.node = groups[self.me // g]
    self.g, self.world = g, world
    self.primary = primary
    self.secondary = None

def gather(self):
    src, group, n = ((self.primary, None, self.world) if self.secondary is None
                     else (self.secondary, self.node, self.g))
    out = src.new_empty(n * src.numel())
    comm.all_gather(out, src, group=group)
    return out

def release(self, full):
    if self.secondary is None:
        self.secondary = torch.chunk(full, self.g)[self.me % self.g].clone()

def step(self, primary):
    self.secondary = None
    self.primary = primary
'''

_HPZ = '''
def __init__(self, primary, g):
    self.world, self.rank, self.g = dist.get_world_size(), dist.get_rank(), g
    for first in range(0, self.world, g):
        group = comm.new_group(list(range(first, first + g)))
        if first <= self.rank < first + g:
            self.node = group
    self.primary, self.secondary = primary, None

def gather(self):
    if self.secondary is None:
        full = torch.empty(self.world * self.primary.numel())
        comm.all_gather(full, self.primary)
    else:
        full = torch.empty(self.g * self.secondary.numel())
        comm.all_gather(full, self.secondary, group=self.node)
    return full

def release(self, full):
    if self.secondary is None:
        n, i = full.numel() // self.g, self.rank % self.g
        self.secondary = full[i * n:(i + 1) * n].clone()

def step(self, primary):
    self.primary, self.secondary = primary, None
'''


def _hpz(old, new):
    assert _HPZ.count(old) == 1, old
    return _HPZ.replace(old, new)


# the secondary over the wrong sub-group: strided "nodes" {0, 2}, {1, 3} (ranks r mod N/g): the same bytes, and
# with the place inside the group taken right the same values, but every backward gather crosses the nodes
_STRIDED = _hpz('''    for first in range(0, self.world, g):
        group = comm.new_group(list(range(first, first + g)))
        if first <= self.rank < first + g:
            self.node = group''', '''    stride = self.world // g
    for first in range(stride):
        group = comm.new_group(list(range(first, self.world, stride)))
        if self.rank % stride == first:
            self.node = group''').replace("i = full.numel() // self.g, self.rank % self.g",
                                          "i = full.numel() // self.g, self.rank // (self.world // self.g)")

MORE_WRONG += [
    {"5.4": _STRIDED},
    # backward gathers from the primary: the secondary is kept but never read (plain ZeRO-3's traffic)
    {"5.4": _hpz("    if self.secondary is None:\n        full = torch.empty(self.world",
                 "    if True:\n        full = torch.empty(self.world")},
    # the secondary slice indexed by the global rank: ranks 2 and 3 keep slices past the end of a node's 1/g
    {"5.4": _hpz("n, i = full.numel() // self.g, self.rank % self.g", "n, i = full.numel() // self.g, self.rank")},
    # the secondary a view of the released buffer, not a copy: backward reads what overwrote it
    {"5.4": _hpz("self.secondary = full[i * n:(i + 1) * n].clone()", "self.secondary = full[i * n:(i + 1) * n]")},
    # step keeps the stale secondary: the next forward gathers last step's values inside the node
    {"5.4": _hpz("def step(self, primary):\n    self.primary, self.secondary = primary, None",
                 "def step(self, primary):\n    self.primary = primary")},
]
