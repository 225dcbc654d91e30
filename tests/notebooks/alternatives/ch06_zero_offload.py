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
    # the norm from torch.linalg.vector_norm, squared and summed over the ranks; the groups' runs cut from the spans
    # relative to the shard; new AdamConfig objects; a list all-gather
    "6.2": '''
S = flat.numel() // world_size
lo = rank * S
host = {"p": flat[lo:lo + S].clone(), "m": link.host_zeros(S), "v": link.host_zeros(S)}
cut = []
for start, end, decays in spans:
    a, b = max(start - lo, 0), min(end - lo, S)
    if a < b:
        cut.append((a, b, decays))

def step(grad, t):
    box = []
    link.to_host(grad, box.append)
    link.poll(wait=True)
    g = box[0].clone()
    total = torch.tensor([float(torch.linalg.vector_norm(g.double())) ** 2], dtype=torch.float64)
    comm.all_reduce(total, op="sum")
    norm = float(total.sqrt())
    coef = max_norm / (norm + 1e-6)
    if coef < 1:
        g = g * coef
    for a, b, decays in cut:
        c = AdamConfig(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay if decays else 0.0)
        adam_step_(host["p"][a:b], g[a:b], host["m"][a:b], host["v"][a:b], t, c)
    up = torch.empty(S)
    link.to_device(up, host["p"])
    parts = [torch.empty(S) for _ in range(world_size)]
    comm.all_gather(parts, up)
    flat.copy_(torch.cat(parts))
    return norm

return step
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

WRONG = {}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # weight decay on every parameter of the shard, biases included (one Adam call over the whole shard)
    {"6.2": '''
S = flat.numel() // world_size
mine = flat[rank * S:(rank + 1) * S]
master, exp_avg, exp_avg_sq = (link.host_zeros(S) for _ in range(3))
master.copy_(mine)

def step(grad, t):
    host = {}
    link.to_host(grad, lambda g: host.update(grad=g.clone()))
    link.poll(wait=True)
    g = host["grad"]
    sq = g.double().square().sum().reshape(1)
    comm.all_reduce(sq)
    norm = sq.sqrt().item()
    g.mul_(min(1.0, max_norm / (norm + 1e-6)))
    adam_step_(master, g, exp_avg, exp_avg_sq, t, cfg)
    link.to_device(mine, master)
    comm.all_gather(flat, mine.clone())
    return norm

return step
'''},
    # the norm of this rank's shard only, no all-reduce: each rank clips by its own norm (the norms fail, and the
    # ranks' scales differ)
    {"6.2": '''
S = flat.numel() // world_size
lo, hi = rank * S, (rank + 1) * S
mine = flat[lo:hi]
master, exp_avg, exp_avg_sq = (link.host_zeros(S) for _ in range(3))
master.copy_(mine)
runs = [(max(s, lo) - lo, min(e, hi) - lo, cfg if d else replace(cfg, weight_decay=0.0))
        for s, e, d in spans if max(s, lo) < min(e, hi)]

def step(grad, t):
    host = {}
    link.to_host(grad, lambda g: host.update(grad=g.clone()))
    link.poll(wait=True)
    g = host["grad"]
    norm = g.norm().item()
    g.mul_(min(1.0, max_norm / (norm + 1e-6)))
    for a, b, c in runs:
        adam_step_(master[a:b], g[a:b], exp_avg[a:b], exp_avg_sq[a:b], t, c)
    link.to_device(mine, master)
    comm.all_gather(flat, mine.clone())
    return norm

return step
'''},
    # the global norm right, but the gradient never clipped: right while max_norm is not reached, wrong at 0.05
    {"6.2": '''
S = flat.numel() // world_size
lo, hi = rank * S, (rank + 1) * S
mine = flat[lo:hi]
master, exp_avg, exp_avg_sq = (link.host_zeros(S) for _ in range(3))
master.copy_(mine)
runs = [(max(s, lo) - lo, min(e, hi) - lo, cfg if d else replace(cfg, weight_decay=0.0))
        for s, e, d in spans if max(s, lo) < min(e, hi)]

def step(grad, t):
    host = {}
    link.to_host(grad, lambda g: host.update(grad=g.clone()))
    link.poll(wait=True)
    g = host["grad"]
    sq = g.double().square().sum().reshape(1)
    comm.all_reduce(sq)
    for a, b, c in runs:
        adam_step_(master[a:b], g[a:b], exp_avg[a:b], exp_avg_sq[a:b], t, c)
    link.to_device(mine, master)
    comm.all_gather(flat, mine.clone())
    return sq.sqrt().item()

return step
'''},
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
