"""Chapter 15: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the ceiling written as (values + tp − 1) // tp, the bytes as a float
    "15.1": '''
values = seq * batch * hidden
per_rank = (values + tp - 1) // tp if partitioned else values
return float(layers * per_rank * bytes_per_value)
''',
}

WRONG = {
    # the attention scores' 5·a·s²·b bytes forgotten: too few layers checkpointed
    "15.2": '''
sbh = seq * batch * hidden
full, none = 2 * sbh, 34 * sbh
for k in range(layers + 1):
    if k * full + (layers - k) * none <= budget_bytes:
        return k
return None
''',
}

# Task 15.3: the input kept as an attribute, the caller's RNG state saved and put back by hand
RIGHT["15.3"] = '''
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
'''
