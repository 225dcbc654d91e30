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
}
