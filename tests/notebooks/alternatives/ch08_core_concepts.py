"""Chapter 8: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the host and NVMe bytes from the simulator's memory bound, the rungs sorted by time, the GPU checked first
    "8.1": '''
from sim.planning.bounds import memory_lower_bound
precision = "bf16" if cluster.gpu.bf16 else "fp16"
why, timed = {}, []
for rung in advice.RUNGS:
    plan = sim.Plan(zero_stage=rung.zero_stage, dp=cluster.world_size, micro_batch_size=1, num_microbatches=8,
                    recompute="full", precision=precision, offload_optimizer=rung.offload_optimizer,
                    offload_param=rung.offload_param)
    need = memory_lower_bound(model, plan)
    r = sim.simulate(model, cluster, plan, costs)
    if r.peak_gpu_bytes > 0.9 * cluster.gpu.hbm_bytes:
        why[rung.name] = "GPU"
    elif need["cpu"] * cluster.gpus_per_node > cluster.cpu_bytes:
        why[rung.name] = "host"
    elif need["nvme"] * cluster.gpus_per_node > cluster.nvme_bytes:
        why[rung.name] = "NVMe"
    else:
        timed.append((r.step_time, rung))
timed.sort(key=lambda x: x[0])
for _, rung in timed[1:]:
    why[rung.name] = "slower"
return timed[0][1], why
''',
}

WRONG = {
    # the formulas with the real Ψ: no padding (stages 0–2 here pad 140 to 141, ZeRO-3's units to 144)
    "8.2": '''
from zero_ref.memory import model_state_bytes
psi = sum(layer_numels)
s = model_state_bytes(psi, zero_stage=stage, dp=world_size, precision="bf16")
sent = (3 if stage == 3 else 2) * (world_size - 1) / world_size * 2 * psi
return {"params": s.params, "grads": s.grads, "optimizer": s.optimizer, "sent": sent}
''',
}

MORE_WRONG = [
    # the literal rule: the first rung that fits in the speed order (slower where ZeRO-3 beats stage-2 offload)
    {"8.1": '''
precision = "bf16" if cluster.gpu.bf16 else "fp16"
chosen, why = None, {}
for rung in advice.RUNGS:
    kw = dict(zero_stage=rung.zero_stage, offload_optimizer=rung.offload_optimizer, offload_param=rung.offload_param)
    tiers = offload_placement(model.num_params, dp=cluster.world_size, precision=precision, **kw)
    plan = sim.Plan(dp=cluster.world_size, micro_batch_size=1, num_microbatches=8, recompute="full",
                    precision=precision, **kw)
    if tiers["cpu"].total * cluster.gpus_per_node > cluster.cpu_bytes:
        why[rung.name] = "host"
    elif tiers["nvme"].total * cluster.gpus_per_node > cluster.nvme_bytes:
        why[rung.name] = "NVMe"
    elif sim.simulate(model, cluster, plan, costs).peak_gpu_bytes > 0.9 * cluster.gpu.hbm_bytes:
        why[rung.name] = "GPU"
    elif chosen is None:
        chosen = rung
    else:
        why[rung.name] = "slower"
return chosen, why
'''},
    # the GPU only: host memory never checked, so a CPU-offload rung that overflows the host wins over NVMe
    {"8.1": '''
precision = "bf16" if cluster.gpu.bf16 else "fp16"
verdict = {}
for rung in advice.RUNGS:
    plan = sim.Plan(zero_stage=rung.zero_stage, dp=cluster.world_size, micro_batch_size=1, num_microbatches=8,
                    recompute="full", precision=precision, offload_optimizer=rung.offload_optimizer,
                    offload_param=rung.offload_param)
    r = sim.simulate(model, cluster, plan, costs)
    verdict[rung.name] = "GPU" if r.peak_gpu_bytes > 0.9 * cluster.gpu.hbm_bytes else r.step_time
times = {k: v for k, v in verdict.items() if v != "GPU"}
best = min(times, key=times.get)
return next(r for r in advice.RUNGS if r.name == best), {k: "GPU" if v == "GPU" else "slower" for k, v in verdict.items() if k != best}
'''},
    # the library's answer: advice.ladder, switched off while the check runs your function
    {"8.1": '''
steps = advice.ladder(model, cluster, simulate=True, costs=costs, num_microbatches=8)
fits = [s for s in steps if s.fits]
best = min(fits, key=lambda s: s.step_time)
why = {}
for s in steps:
    if s is not best:
        why[s.rung.name] = "slower" if s.fits else ("GPU" if not s.fits_gpu else "host" if not s.fits_cpu else "NVMe")
return best.rung, why
'''},
    # ZeRO-3's backward re-gather forgotten: every stage sends one all-reduce's worth (the ZeRO-3 "sent" check fails)
    {"8.2": '''
n = world_size
pad = lambda k: -(-k // n) * n
if stage < 3:
    flat = pad(sum(layer_numels))
    params, grads = 2 * flat, 2 * flat if stage < 2 else 2 * flat // n
    optimizer = 12 * flat if stage == 0 else 12 * flat // n
else:
    flat = sum(pad(k) for k in layer_numels)
    params, grads, optimizer = 2 * flat // n, 2 * flat // n, 12 * flat // n
return {"params": params, "grads": grads, "optimizer": optimizer, "sent": 2 * (n - 1) / n * 2 * flat}
'''},
]
