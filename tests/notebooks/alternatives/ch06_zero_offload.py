"""Chapter 6: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # a bisection over 1..64 (the slowdown falls as the batch grows), the budget as the relative excess
    "6.1": '''
kw = dict(zero_stage=2, dp=1, precision="fp16", recompute="full", gradient_clipping=0.0)
net, gpu = sim.Model.preset(model), sim.Cluster.preset("V100-32GB", nodes=1, gpus_per_node=1)
costs = sim.Costs(cpu_adam_rate=cpu_adam_rate)

def within(mb):
    on = sim.simulate(net, gpu, sim.Plan(micro_batch_size=mb, offload_optimizer="cpu", **kw), costs).step_time
    off = sim.simulate(net, gpu, sim.Plan(micro_batch_size=mb, **kw), costs).step_time
    return on / off - 1 <= budget

if not within(64):
    return None
lo, hi = 0, 64
while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if within(mid) else (mid, hi)
return hi
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
    # the simulator's default CPU Adam rate, not the host's: right only for hosts at 2e9 parameters/s
    {"6.1": '''
gpu, net = sim.Cluster.preset("V100-32GB", nodes=1, gpus_per_node=1), sim.Model.preset(model)
for mb in range(1, 65):
    t = [sim.simulate(net, gpu, sim.Plan(zero_stage=2, dp=1, micro_batch_size=mb, offload_optimizer=off,
                                          precision="fp16", recompute="full", gradient_clipping=0.0)).step_time
         for off in ("none", "cpu")]
    if t[1] <= (1 + budget) * t[0]:
        return mb
return None
'''},
    # the cost taken as a share of the offloaded step (1 - none/cpu), not of the step without offload:
    # a looser budget, one sequence too few
    {"6.1": '''
gpu, net = sim.Cluster.preset("V100-32GB", nodes=1, gpus_per_node=1), sim.Model.preset(model)
costs = sim.Costs(cpu_adam_rate=cpu_adam_rate)
for mb in range(1, 65):
    none, cpu = (sim.simulate(net, gpu, sim.Plan(zero_stage=2, dp=1, micro_batch_size=mb, offload_optimizer=off,
                 precision="fp16", recompute="full", gradient_clipping=0.0), costs).step_time for off in ("none", "cpu"))
    if 1 - none / cpu <= budget:
        return mb
return None
'''},
    # back of the envelope: CPU Adam seconds against budget × one sequence's compute, ignoring the Adam the GPU
    # no longer runs and the copies' tail
    {"6.1": '''
import math
gpu, net = sim.Cluster.preset("V100-32GB", nodes=1, gpus_per_node=1), sim.Model.preset(model)
one = sim.simulate(net, gpu, sim.Plan(zero_stage=2, dp=1, micro_batch_size=1, precision="fp16", recompute="full",
                                      gradient_clipping=0.0), sim.Costs(cpu_adam_rate=cpu_adam_rate)).step_time
mb = math.ceil(net.num_params / cpu_adam_rate / (budget * one))
return mb if mb <= 64 else None
'''},
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
