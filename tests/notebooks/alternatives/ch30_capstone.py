"""Chapter 30: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the config assembled key by key with dict() and conditional updates, nvme paths added afterwards
    "30.2": '''
zero = dict(stage=plan.zero_stage, overlap_comm=plan.overlap_comm,
            reduce_bucket_size=plan.reduce_bucket_size, allgather_bucket_size=plan.allgather_bucket_size)
if plan.offload_optimizer != "none":
    zero["offload_optimizer"] = {"device": plan.offload_optimizer}
if plan.offload_param != "none":
    zero["offload_param"] = {"device": plan.offload_param}
for section in ("offload_optimizer", "offload_param"):
    if zero.get(section, {}).get("device") == "nvme":
        zero[section]["nvme_path"] = "/local_nvme"
gas = plan.num_microbatches
config = dict(train_micro_batch_size_per_gpu=plan.micro_batch_size, gradient_accumulation_steps=gas,
              train_batch_size=plan.micro_batch_size * gas * plan.dp, gradient_clipping=plan.gradient_clipping,
              zero_optimization=zero, optimizer=dict(optimizer))
config.update({"fp16": {"enabled": True}} if plan.precision == "fp16"
              else {"bf16": {"enabled": True}} if plan.precision == "bf16" else {})
return config
''',
    # the error as a difference over the measurement; the verdict from a chained comparison
    "30.3": '''
error = (predicted - measured) / measured
return error, -tolerance < error < tolerance
''',
    # a plan written out by hand: no tensor parallelism, ZeRO-1 over four pipeline stages (DeepSpeed allows
    # ZeRO-1 with a pipeline), the most micro-batches to shrink the bubble
    "30.4": '''
gpus = cluster.world_size
return sim.Plan(zero_stage=1, tp=1, pp=4, dp=gpus // 4, micro_batch_size=1,
                num_microbatches=global_batch // (gpus // 4), precision="bf16", attention=BRIEF["attention"])
''',
}

WRONG = {
    # the host and NVMe limits compared with one GPU's offloaded states instead of a whole node's
    "30.1": '''
r = sim.simulate(model, cluster, plan, COSTS, granularity=search.granularity_for(model, plan))
tiers = offload_placement(model.num_params, zero_stage=plan.zero_stage, dp=plan.dp, precision=plan.precision,
                          offload_optimizer=plan.offload_optimizer, offload_param=plan.offload_param)
per_gpu = {t: tiers[t].total / (plan.tp * plan.pp) for t in ("cpu", "nvme")}
return {"gpu": r.peak_gpu_bytes <= memory_fraction * cluster.gpu.hbm_bytes,
        "cpu": per_gpu["cpu"] <= cluster.cpu_bytes, "nvme": per_gpu["nvme"] <= cluster.nvme_bytes}
''',
    # the collectives copied from the simulator's booking: one entry per call, and the norm's all-reduce as
    # one fp32 (4 bytes) where zero_ref sends two float64
    "30.5": '''
from zero_ref.profiling.profile import COURSE_GPT
booked = fit_local.work_totals(fit_local.gpt_model(COURSE_GPT), plan)["collectives"]
comm = {}
for op, nbytes, _ in booked:
    calls, total = comm.get(op, (0, 0))
    comm[op] = (calls + 1, total + int(nbytes))
states = model_state_bytes(num_params, zero_stage=plan.zero_stage, dp=plan.dp, precision=plan.precision)
return {"memory": {"params": states.params, "grads": states.grads, "optimizer": states.optimizer}, "comm": comm}
''',
}
