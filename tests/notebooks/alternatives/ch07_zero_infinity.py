"""Chapter 7: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # a deque of swapped-in sub-groups, refilled after every write; the buffers dropped by popping them
    "7.1": '''
from collections import deque
n = len(file.numels)
slots = max(1, buffer_count // 3)
queue, nxt = deque(), 0
while nxt < n and len(queue) < slots:
    queue.append((nxt, file.read(nxt)))
    nxt += 1
while queue:
    i, states = queue.popleft()
    file.adam(i, states)
    file.write(i, states)
    states = None
    if nxt < n:
        queue.append((nxt, file.read(nxt)))
        nxt += 1
''',
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

WRONG = {}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # serial whatever the buffers: read, step, write, next (right only at buffer_count 3 to 5)
    {"7.1": '''
for i in range(len(file.numels)):
    bufs = file.read(i)
    file.adam(i, bufs)
    file.write(i, bufs)
    del bufs
'''},
    # every sub-group read up front: the right order only when the buffers hold them all, too many buffers otherwise
    {"7.1": '''
states = [file.read(i) for i in range(len(file.numels))]
for i in range(len(file.numels)):
    file.adam(i, states[i])
    file.write(i, states[i])
'''},
    # the stepped sub-group's buffers still referenced when the next one is read (the name is rebound only after
    # the read): the right log, one sub-group's buffers too many
    {"7.1": '''
n, ahead = len(file.numels), buffer_count // 3
inflight = {i: file.read(i) for i in range(min(ahead, n))}
for i in range(n):
    bufs = inflight.pop(i)
    file.adam(i, bufs)
    file.write(i, bufs)
    if i + ahead < n:
        inflight[i + ahead] = file.read(i + ahead)
'''},
    # the sub-group being stepped not counted against the buffers: reads one sub-group too far ahead
    {"7.1": '''
n, ahead = len(file.numels), buffer_count // 3 + 1
inflight = {i: file.read(i) for i in range(min(ahead, n))}
for i in range(n):
    bufs = inflight.pop(i)
    file.adam(i, bufs)
    file.write(i, bufs)
    del bufs
    if i + ahead < n:
        inflight[i + ahead] = file.read(i + ahead)
'''},
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
