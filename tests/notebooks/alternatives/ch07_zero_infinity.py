"""Chapter 7: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # tiles fetched inside the expression that uses them, an output buffer filled in place, backward by columns
    "7.2": '''
class _Tiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp):
        ctx.save_for_backward(inp)
        y = inp.new_zeros(inp.shape[0], store.rows[-1].stop)
        for i, rows in enumerate(store.rows):
            for j, cols in enumerate(store.cols):
                y[:, rows] += inp[:, cols] @ store.fetch(i, j).t()
        return y

    @staticmethod
    def backward(ctx, gy):
        (inp,) = ctx.saved_tensors
        parts = []
        for j, cols in enumerate(store.cols):
            acc = 0
            for i, rows in enumerate(store.rows):
                acc = acc + gy[:, rows] @ store.fetch(i, j)
                store.add_grad(i, j, torch.einsum("bo,bi->oi", gy[:, rows], inp[:, cols]))
            parts.append(acc)
        return torch.cat(parts, 1)

return _Tiles.apply(x) + store.bias
''',
}

WRONG = {
    # reads and writes on two separate queues: a write never delays the next read
    "7.1": '''
reads_free = writes_free = cpu = 0.0
out = []
ready = read[0]
reads_free = ready
for i in range(len(read)):
    cpu = max(cpu, ready)
    if i + 1 < len(read):
        reads_free = max(cpu, reads_free) + read[i + 1]
        ready = reads_free
    out.append((cpu, cpu + step[i]))
    cpu += step[i]
    writes_free = max(cpu, writes_free) + write[i]
return out
''',
}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # the tiles fetched in forward kept in ctx for backward: the right values, one fetch per tile in all, but the
    # whole weight stays alive from forward to backward (the "alive after forward" check fails it)
    {"7.2": '''
class Tiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.tiles = {}
        out = []
        for i in range(len(store.rows)):
            acc = None
            for j, cols in enumerate(store.cols):
                w = store.fetch(i, j)
                ctx.tiles[i, j] = w
                part = x[:, cols] @ w.T
                acc = part if acc is None else acc + part
            out.append(acc)
        return torch.cat(out, 1)

    @staticmethod
    def backward(ctx, grad_out):
        x, = ctx.saved_tensors
        grad_x = torch.zeros_like(x)
        for i, rows in enumerate(store.rows):
            g = grad_out[:, rows]
            for j, cols in enumerate(store.cols):
                w = ctx.tiles[i, j]
                grad_x[:, cols] += g @ w
                store.add_grad(i, j, g.T @ x[:, cols])
        return grad_x

return Tiled.apply(x) + store.bias
'''},
    # no del: the name w still holds the previous tile while the next one is fetched, so two tiles are alive at
    # once (the peak check fails it)
    {"7.2": '''
class Tiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        out = []
        for i in range(len(store.rows)):
            acc = None
            for j, cols in enumerate(store.cols):
                w = store.fetch(i, j)
                part = x[:, cols] @ w.T
                acc = part if acc is None else acc + part
            out.append(acc)
        return torch.cat(out, 1)

    @staticmethod
    def backward(ctx, grad_out):
        x, = ctx.saved_tensors
        grad_x = torch.zeros_like(x)
        for i, rows in enumerate(store.rows):
            g = grad_out[:, rows]
            for j, cols in enumerate(store.cols):
                w = store.fetch(i, j)
                grad_x[:, cols] += g @ w
                store.add_grad(i, j, g.T @ x[:, cols])
        return grad_x

return Tiled.apply(x) + store.bias
'''},
]
