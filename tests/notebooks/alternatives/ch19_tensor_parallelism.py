"""Chapter 19: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # torch.chunk instead of index arithmetic: column shards of W1 (rows of the weight), row shards of W2
    "19.1": '''
act = torch.nn.functional.gelu
return [act(x @ a.T) @ b.T for a, b in zip(w1.chunk(t, dim=0), w2.chunk(t, dim=1))]
''',
    # integer bytes (the ring moves whole elements here), a list instead of a tuple
    "19.2": '''
ring = b * s * h * dtype_bytes * (t - 1) // t
forward = 4 * ring                            # TP: 2 all-reduces = 4 ring halves; SP: 2 × (AG + RS)
backward = 6 * ring if sp else 4 * ring       # SP's backward re-gathers the two inputs it did not keep
return [forward, backward]
''',
}

WRONG = {
    # the order string read slowest-varying first: the strides of the axes reversed
    "19.3": '''
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
    "19.4": '''
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
