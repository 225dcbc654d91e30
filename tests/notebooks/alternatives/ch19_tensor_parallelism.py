"""Chapter 19: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the fused weight viewed as [3, heads, head_dim, C] and indexed by this rank's heads; own f and g through
    # comm.all_reduce; torch's scaled_dot_product_attention with is_causal instead of a written-out softmax
    "19.3": '''
class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        comm.all_reduce(g, group=ctx.group)
        return g, None


class G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        comm.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


r, t = comm.get_rank(group), comm.get_world_size(group)
B, T, C = x.shape
hd, mine = C // n_heads, slice(r * n_heads // t, (r + 1) * n_heads // t)
w = qkv_w.view(3, n_heads, hd, C)[:, mine].reshape(-1, C)
b = qkv_b.view(3, n_heads, hd)[:, mine].reshape(-1)
qkv = torch.nn.functional.linear(F.apply(x, group), w, b).view(B, T, 3, -1, hd).permute(2, 0, 3, 1, 4)
y = torch.nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
y = y.transpose(1, 2).reshape(B, T, -1)
cols = proj_w.view(C, n_heads, hd)[:, mine].reshape(C, -1)
return G.apply(y @ cols.T, group) + proj_b
''',
}

_ATTENTION = '''
r, t = comm.get_rank(group), comm.get_world_size(group)
B, T, C = x.shape
c = C // t
{rows}
q, k, v = ({x_in} @ w.T + b).split(c, dim=-1)
heads, hd = {heads}
q, k, v = (u.view(B, T, heads, hd).transpose(1, 2) for u in (q, k, v))
att = (q @ k.transpose(-2, -1)) / hd ** 0.5 + torch.full((T, T), float("-inf")).triu(1)
y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, c)
{out}
'''
_HEAD_ROWS = '''rows = [slice(j * C + r * c, j * C + (r + 1) * c) for j in range(3)]
w, b = torch.cat([qkv_w[s] for s in rows]), torch.cat([qkv_b[s] for s in rows])'''
_RIGHT = dict(rows=_HEAD_ROWS, x_in="mappings.copy_to_tp(x, group)", heads="n_heads // t, C // n_heads",
              out="return mappings.reduce_from_tp(y @ proj_w[:, r * c:(r + 1) * c].T, group) + proj_b")

WRONG = {
    # the order string read slowest-varying first: the strides of the axes reversed
    "19.1": '''
sizes = {"tp": tp, "dp": dp, "pp": pp}
stride, s = {}, 1
for axis in reversed(order.split("-")):
    stride[axis] = s
    s *= sizes[axis]
count = 0
for d in range(dp):
    for p in range(pp):
        ranks = [t * stride["tp"] + d * stride["dp"] + p * stride["pp"] for t in range(tp)]
        count += len({r // gpus_per_node for r in ranks}) > 1
return count
''',
    # g without f: the forward is right, but each rank's gradient of x is only its partial sum
    "19.2": '''
class Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        comm.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_mlp(x, w1, b1, w2, b2, group=None):
    return Reduce.apply(torch.nn.functional.gelu(x @ w1.T + b1) @ w2.T, group) + b2
''',
}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # the fused QKV weight cut into t contiguous blocks: rank 0 gets all of Q and part of K, mixing q, k and v
    {"19.3": _ATTENTION.format(**{**_RIGHT, "rows": "w, b = qkv_w.chunk(t)[r], qkv_b.chunk(t)[r]"})},
    # every head split mid-head: the right rows, but read as n_heads heads of head_dim / t features each
    {"19.3": _ATTENTION.format(**{**_RIGHT, "heads": "n_heads, C // n_heads // t"})},
    # no f: the forward is right, but the gradient of x on each rank is only its own heads' share
    {"19.3": _ATTENTION.format(**{**_RIGHT, "x_in": "x"})},
    # f and g swapped: x is all-reduced in forward (t·x), the partial outputs never are
    {"19.3": _ATTENTION.format(**{**_RIGHT, "x_in": "mappings.reduce_from_tp(x, group)",
                                  "out": "return mappings.copy_to_tp(y @ proj_w[:, r * c:(r + 1) * c].T, group) + proj_b"})},
    # the bias added on every rank before the all-reduce: t copies of it in the sum
    {"19.3": _ATTENTION.format(**{**_RIGHT, "out": "return mappings.reduce_from_tp(y @ proj_w[:, r * c:(r + 1) * c].T + proj_b, group)"})},
    # the bypass: the whole attention on every rank, divided by t before the all-reduce; the output and the
    # gradient of x come out right, but every rank computed (and gets gradients for) every head
    {"19.3": '''
B, T, C = x.shape
t, hd = comm.get_world_size(group), C // n_heads
q, k, v = (mappings.copy_to_tp(x, group) @ qkv_w.T + qkv_b).split(C, dim=-1)
q, k, v = (u.view(B, T, n_heads, hd).transpose(1, 2) for u in (q, k, v))
y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
return mappings.reduce_from_tp((y @ proj_w.T + proj_b) / t, group)
'''},
]
