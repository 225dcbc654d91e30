"""Chapter 9: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # divisibility conditions instead of resolving the keys, returned as a tuple
    "9.1": '''
t = config.get("train_batch_size")
m = config.get("train_micro_batch_size_per_gpu")
g = config.get("gradient_accumulation_steps")

def resolves(dp):
    if t is None:
        return m is not None                        # t = m × g × dp always exists
    if m is None:
        return t % ((g or 1) * dp) == 0 and t // ((g or 1) * dp) > 0
    if g is None:
        return t % (m * dp) == 0 and t // (m * dp) > 0
    return t == m * g * dp

return tuple(dp for dp in range(1, max_dp + 1) if resolves(dp))
''',
    # the accumulation written down too, the numbers in another notation, built with dict()
    "9.2": '''
warmup = dict(warmup_min_lr=0.00003, warmup_max_lr=0.0003, warmup_num_steps=100, warmup_type="linear")
return dict(train_batch_size=64, train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=4,
            bf16=dict(enabled=True), gradient_clipping=1,
            zero_optimization=dict(stage=2, offload_optimizer=dict(device="cpu")),
            optimizer=dict(type="AdamW", params=dict(lr=0.0003, weight_decay=0.1)),
            scheduler=dict(type="WarmupLR", params=warmup))
''',
}

WRONG = {
    # the seed's fp32 kept (no bf16 section), everything else repaired
    "9.3": '''
return {
    "train_batch_size": 1024,
    "train_micro_batch_size_per_gpu": 32,
    "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True},
}
''',
}
