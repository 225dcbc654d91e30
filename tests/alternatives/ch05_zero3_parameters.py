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
