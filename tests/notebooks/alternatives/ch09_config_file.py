"""Chapter 9: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
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
    # GAS (or the micro-batch) by floor division, never checked against the identity: 100 = 4 × 3 × 8 is accepted
    "9.1": '''
t = config.get("train_batch_size")
m = config.get("train_micro_batch_size_per_gpu")
g = config.get("gradient_accumulation_steps")
if t is None and m is None:
    raise ValueError("set train_batch_size or train_micro_batch_size_per_gpu")
if g is None:
    g = t // (m * dp) if (t is not None and m is not None) else 1
if m is None:
    m = t // (dp * g)
if t is None:
    t = m * g * dp
if min(t, m, g) <= 0:
    raise ValueError("a batch key is not positive")
return t, m, g
''',
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
