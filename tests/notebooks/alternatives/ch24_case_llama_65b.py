"""Chapter 24: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # from the largest candidate down, stop at the first that fits; a list instead of a tuple
    "24.2": '''
for mbs in sorted(candidates, reverse=True):
    plan = sim.Plan(zero_stage=1, tp=8, pp=8, dp=4, micro_batch_size=mbs, num_microbatches=2048 // (4 * mbs),
                    recompute="selective", sequence_parallel=True, precision="bf16", attention="flash")
    r = sim.simulate(model, cluster, plan, COSTS, granularity=search.granularity_for(model, plan))
    if r.peak_gpu_bytes <= limit:
        return [mbs, r.step_time]
return None
''',
}

WRONG = {
    # the seed's slip: the optimizer states divided by TP and DP, the pipeline split forgotten
    "24.1": '''
local = psi / (tp * pp)
return {"params": 2 * local / (dp if zero_stage >= 3 else 1),
        "grads": 2 * local / (dp if zero_stage >= 2 else 1),
        "optimizer": 12 * psi / tp / (dp if zero_stage >= 1 else 1)}
''',
}
