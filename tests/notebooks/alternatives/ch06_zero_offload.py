"""Chapter 6: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # math.ceil and float bytes per element, returned as a list
    "6.1": '''
import math
element = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0}[precision]
shard = math.ceil(num_params / world_size) * element
return [shard if stage == 1 else gas * shard, shard]
''',
    # the mean taken on the device (op="avg"), the delay as "send the master from before Adam", a list all-gather
    "6.3": '''
lo, S = rank * (flat16.numel() // world_size), flat16.numel() // world_size
state = {"master": flat16[lo:lo + S].to(torch.float32), "m": torch.zeros(S), "v": torch.zeros(S)}  # host

def step(grad16, t):
    part = torch.zeros(S, dtype=grad16.dtype)
    comm.reduce_scatter(part, grad16, op="avg")
    arrived = []
    link.to_host(part, arrived.append)
    link.poll(wait=True)
    before = state["master"].clone()
    adam_step_(state["master"], arrived[0].to(torch.float32), state["m"], state["v"], t, cfg)
    up = torch.empty(S, dtype=flat16.dtype)
    link.to_device(up, before if delay else state["master"])
    pieces = [torch.empty_like(up) for _ in range(world_size)]
    comm.all_gather(pieces, up)
    flat16.copy_(torch.cat(pieces))

return step
''',
}

WRONG = {
    # the master and the moments step on the host, but the 16-bit copy on the device is never updated
    "6.2": '''
adam_step_(master, grad16.float(), exp_avg, exp_avg_sq, step, cfg)
''',
}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # the gradient all-reduced and sent to the host whole, the shard cut there: the right parameters, but each
    # step moves 2·Ψ bytes down instead of 2·S (the bytes-per-step check fails it)
    {"6.3": '''
S = flat16.numel() // world_size
mine = flat16[rank * S:(rank + 1) * S]
master, exp_avg, exp_avg_sq = (link.host_zeros(S) for _ in range(3))
master.copy_(mine)

def step(grad16, t):
    full = grad16.clone()
    comm.all_reduce(full)
    host = {}
    link.to_host(full, lambda g: host.update(grad=g.float() / world_size))
    link.poll(wait=True)
    if delay:
        link.to_device(mine, master)
    adam_step_(master, host["grad"][rank * S:(rank + 1) * S], exp_avg, exp_avg_sq, t, cfg)
    if not delay:
        link.to_device(mine, master)
    comm.all_gather(flat16, mine.clone())

return step
'''},
    # the delay flag ignored: with DPU the step's result goes up at once, so the model never runs on weights one
    # step old (the DPU run's parameters differ from the one-step-late reference)
    {"6.3": '''
S = flat16.numel() // world_size
mine = flat16[rank * S:(rank + 1) * S]
master, exp_avg, exp_avg_sq = (link.host_zeros(S) for _ in range(3))
master.copy_(mine)

def step(grad16, t):
    shard = torch.empty(S, dtype=grad16.dtype)
    comm.reduce_scatter(shard, grad16)
    host = {}
    link.to_host(shard, lambda g: host.update(grad=g.float() / world_size))
    link.poll(wait=True)
    adam_step_(master, host["grad"], exp_avg, exp_avg_sq, t, cfg)
    link.to_device(mine, master)
    comm.all_gather(flat16, mine.clone())

return step
'''},
]
