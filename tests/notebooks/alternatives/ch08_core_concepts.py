"""Chapter 8: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the ratio of the per-parameter byte counts, both multiplied by n
    "8.1": '''
return 16 * n / (16 * n, 4 * n + 12, 2 * n + 14, 16)[stage]
''',
}

WRONG = {
    # the formulas with the real Ψ: no padding (stages 0–2 here pad 140 to 141, ZeRO-3's units to 144)
    "8.3": '''
from zero_ref.memory import model_state_bytes
psi = sum(layer_numels)
s = model_state_bytes(psi, zero_stage=stage, dp=world_size, precision="bf16")
sent = (3 if stage == 3 else 2) * (world_size - 1) / world_size * 2 * psi
return {"params": s.params, "grads": s.grads, "optimizer": s.optimizer, "sent": sent}
''',
    # optimizer offload moves the Adam states, but forgets the host's fp32 gradient partition (4Ψ/N)
    "8.2": '''
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
''',
}
