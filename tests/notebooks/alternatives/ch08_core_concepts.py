"""Chapter 8: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # tier by tier from the per-parameter bytes of each stage, without model_state_bytes
    "8.1": '''
stage = rung.zero_stage
param = 2 * psi / dp if stage == 3 else 2 * psi
grad = 2 * psi / dp if stage >= 2 else 2 * psi
optim = 12 * psi / dp if stage >= 1 else 12 * psi
tiers = {"gpu": param + grad + optim, "cpu": 0, "nvme": 0}
if rung.offload_optimizer != "none":
    tiers["gpu"] -= grad + optim
    tiers[rung.offload_optimizer] += optim + 4 * psi / dp
if rung.offload_param != "none":
    tiers["gpu"] -= param
    tiers[rung.offload_param] += param
return tiers["gpu"], tiers["cpu"], tiers["nvme"]
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
    # optimizer offload moves the Adam states, but forgets the host's fp32 gradient partition (4Ψ/N)
    {"8.1": '''
s = model_state_bytes(psi, zero_stage=rung.zero_stage, dp=dp)
gpu, host, nvme = s.params + s.grads + s.optimizer, 0.0, 0.0
if rung.offload_optimizer != "none":
    gpu -= s.optimizer + s.grads
    if rung.offload_optimizer == "cpu":
        host += s.optimizer
    else:
        nvme += s.optimizer
if rung.offload_param != "none":
    gpu -= s.params
    if rung.offload_param == "cpu":
        host += s.params
    else:
        nvme += s.params
return gpu, host, nvme
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
    # stage 1 taken to partition the gradients too (it keeps the full 16-bit gradient: the ZeRO-1 row fails)
    {"8.1": '''
stage = rung.zero_stage
param = 2 * psi / dp if stage == 3 else 2 * psi
grad = 2 * psi / dp if stage >= 1 else 2 * psi
optim = 12 * psi / dp if stage >= 1 else 12 * psi
gpu, off = param + grad + optim, {"cpu": 0.0, "nvme": 0.0}
if rung.offload_optimizer != "none":
    gpu -= grad + optim
    off[rung.offload_optimizer] += optim + 4 * psi / dp
if rung.offload_param != "none":
    gpu -= param
    off[rung.offload_param] += param
return gpu, off["cpu"], off["nvme"]
'''},
]
