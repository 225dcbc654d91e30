"""Chapter 15: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # Task 15.1: the input kept as an attribute, the caller's RNG state saved and put back by hand
    "15.1": '''
@staticmethod
def forward(ctx, fn, x):
    ctx.fn, ctx.x, ctx.state = fn, x.detach(), torch.random.get_rng_state()
    with torch.no_grad():
        out = fn(x)
    return out

@staticmethod
def backward(ctx, g):
    caller = torch.get_rng_state()
    torch.set_rng_state(ctx.state)
    x = ctx.x.clone().requires_grad_(True)
    with torch.enable_grad():
        y = ctx.fn(x)
    torch.set_rng_state(caller)
    y.backward(g)
    return None, x.grad
''',
    # Task 15.2: q, k, v kept as attributes, the class's core called, the caller's RNG put back by hand,
    # backward through .backward() on fresh leaves
    "15.2": '''
attn = block.attn

class SelectiveCore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.state = torch.random.get_rng_state()
        ctx.qkv = (q.detach(), k.detach(), v.detach())
        return type(attn).core(attn, q, k, v)

    @staticmethod
    def backward(ctx, g):
        caller = torch.random.get_rng_state()
        torch.random.set_rng_state(ctx.state)
        leaves = [t.clone().requires_grad_(True) for t in ctx.qkv]
        with torch.enable_grad():
            out = type(attn).core(attn, *leaves)
        torch.random.set_rng_state(caller)
        out.backward(g)
        return tuple(t.grad for t in leaves)

attn.core = lambda q, k, v: SelectiveCore.apply(q, k, v)
''',
}

WRONG = {}

MORE_WRONG = [
    # 15.2 recomputes the whole block (full recomputation): it keeps 2sbh a block and redoes every matmul
    {"15.2": '''
forward = block.forward

class Whole(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.rng = torch.get_rng_state()
        ctx.save_for_backward(x)
        return forward(x)

    @staticmethod
    def backward(ctx, g):
        x = ctx.saved_tensors[0].detach().requires_grad_()
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.rng)
            with torch.enable_grad():
                out = forward(x)
        torch.autograd.backward(out, g)
        return x.grad

block.forward = Whole.apply
'''},
    # 15.2 keeps the core's graph (its scores, softmax and mask) from forward and backpropagates through it
    {"15.2": '''
core = block.attn.core

class Core(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        with torch.enable_grad():
            ctx.leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            ctx.out = core(*ctx.leaves)
        return ctx.out.detach()

    @staticmethod
    def backward(ctx, g):
        return torch.autograd.grad(ctx.out, ctx.leaves, g)

block.attn.core = Core.apply
'''},
    # 15.2 forgets dropout's RNG: the recompute draws a new attention-dropout mask
    {"15.2": '''
core = block.attn.core

class Core(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return core(q, k, v)

    @staticmethod
    def backward(ctx, g):
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            out = core(q, k, v)
        return torch.autograd.grad(out, (q, k, v), g)

block.attn.core = Core.apply
'''},
    # 15.2 restores the forward's RNG state for the recompute and leaves the caller's generator there
    {"15.2": '''
core = block.attn.core

class Core(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.rng = torch.get_rng_state()
        ctx.save_for_backward(q, k, v)
        return core(q, k, v)

    @staticmethod
    def backward(ctx, g):
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        torch.set_rng_state(ctx.rng)
        with torch.enable_grad():
            out = core(q, k, v)
        return torch.autograd.grad(out, (q, k, v), g)

block.attn.core = Core.apply
'''},
    # 15.2 borrows the model's own selective switch (torch.utils.checkpoint inside)
    {"15.2": '''
block.attn.selective = True
'''},
]

# 15.1 keeps the whole graph of fn (run with grad in forward, held as an attribute): no recomputation at all
MORE_WRONG.append({"15.1": '''
@staticmethod
def forward(ctx, fn, x):
    with torch.enable_grad():
        ctx.x = x.detach().requires_grad_()
        ctx.out = fn(ctx.x)
    return ctx.out.detach()

@staticmethod
def backward(ctx, g):
    ctx.out.backward(g)
    return None, ctx.x.grad
'''})
