"""Chapter 9: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # which keys are given, as a tuple of flags; one condition for the assertion
    "9.1": '''
keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
t, m, g = (config.get(k) for k in keys)
given = (t is not None, m is not None, g is not None)
if given == (True, True, False):
    g = t // m // dp
elif given == (True, False, True):
    m = t // dp // g
elif given == (False, True, True):
    t = m * g * dp
elif given == (True, False, False):
    m, g = t // dp, 1
elif given == (False, True, False):
    t, g = m * dp, 1
elif not given[0] and not given[1]:
    raise ValueError("give train_batch_size or train_micro_batch_size_per_gpu")
if not (t > 0 and m > 0 and g > 0 and t == m * g * dp):
    raise ValueError(f"{t} != {m} x {g} x {dp}")
return (t, m, g)
''',
    # the bytes counted with chapter 2's formulas by hand (bf16: 2 + 2 + 12 bytes per parameter), dict() configs
    "9.2": '''
n = billions * 1e9
candidates = [(0, None, None), (1, None, None), (2, None, None), (3, None, None),
              (2, "cpu", None), (3, "cpu", None), (3, "cpu", "cpu")]
for stage, opt, param in candidates:
    params = 2 * n / (dp if stage == 3 else 1)
    grads = 0 if opt else 2 * n / (dp if stage >= 2 else 1)
    states = 0 if opt else 12 * n / (dp if stage >= 1 else 1)
    if param:
        params = 0
    if params + grads + states <= gpu_gb * 1e9:
        zero = dict(stage=stage)
        if opt:
            zero["offload_optimizer"] = dict(device=opt)
        if param:
            zero["offload_param"] = dict(device=param)
        return dict(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=4, bf16=dict(enabled=True),
                    zero_optimization=zero)
''',
}

# Task 9.2's reference with one thing changed, for the mistakes below.
_FIT = '''
cpu = {"device": "cpu"}
cheapest_first = [{"stage": 0}, {"stage": 1}, {"stage": 2}, {"stage": 3},
                  {"stage": 2, "offload_optimizer": cpu},
                  {"stage": 3, "offload_optimizer": cpu},
                  {"stage": 3, "offload_optimizer": cpu, "offload_param": cpu}]
for zero in cheapest_first:
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
              "bf16": {"enabled": True}, "zero_optimization": zero}
    on_gpu = C.model_state_placement(C.parse(config, dp=dp), round(billions * 1e9))["gpu"].total
    if on_gpu <= gpu_gb * 1e9:
        return config
raise ValueError("does not fit")
'''


def _fit(old, new):
    assert old in _FIT, old
    return _FIT.replace(old, new)


MORE_WRONG = [
    # GAS (or the micro-batch) by floor division, never checked against the identity: 100 = 4 × 3 × 8 is accepted
    {"9.1": '''
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
'''},
    # the assertion without its "> 0": a train_batch_size of 0 resolves to (0, 0, 1) and passes the identity
    {"9.1": '''
t = config.get("train_batch_size")
m = config.get("train_micro_batch_size_per_gpu")
g = config.get("gradient_accumulation_steps")
if t is None and m is None:
    raise ValueError("set train_batch_size or train_micro_batch_size_per_gpu")
if t is not None and m is not None and g is None:
    g = t // m // dp
elif t is not None and g is not None and m is None:
    m = t // dp // g
elif m is not None and g is not None and t is None:
    t = m * g * dp
elif m is None and g is None:
    m, g = t // dp, 1
elif t is None and g is None:
    t, g = m * dp, 1
if t != m * g * dp:
    raise ValueError("inconsistent")
return t, m, g
'''},
    # an exact fit counted as not fitting (< for <=): 4B on 8 GPUs of 15 GB goes to stage 3 instead of stage 2
    {"9.2": _fit("if on_gpu <= gpu_gb * 1e9:", "if on_gpu < gpu_gb * 1e9:")},
    # the bytes on every tier counted against the GPU: offloading never seems to help
    {"9.2": _fit('["gpu"].total', '["gpu"].total + C.model_state_placement(C.parse(config, dp=dp), '
                                  'round(billions * 1e9))["cpu"].total')},
    # the Transformers guide's order (stage 2 + offload before stage 3): more host traffic where stage 3 fits alone
    {"9.2": _fit('{"stage": 3},\n                  {"stage": 2, "offload_optimizer": cpu},',
                 '{"stage": 2, "offload_optimizer": cpu},\n                  {"stage": 3},')},
    # GB read as GiB (2**30 bytes): 4B on 8 GPUs of 14.9 GB "fits" at stage 2 (15e9 bytes)
    {"9.2": _fit("gpu_gb * 1e9", "gpu_gb * 2**30")},
    # no bf16 section: fp32 training, whose states are counted differently (and the check wants bf16)
    {"9.2": _fit('\n              "bf16": {"enabled": True}, ', '\n              ')},
    # stage 2 + offload never tried: one GPU (ZeRO-Offload's setting) and 7B on 4 GPUs go to stage 3 + offload
    {"9.2": _fit('\n                  {"stage": 2, "offload_optimizer": cpu},', '')},
]
