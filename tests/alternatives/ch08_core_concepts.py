"""Chapter 8: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the ratio of the per-parameter byte counts, both multiplied by n
    "8.1": '''
return 16 * n / (16 * n, 4 * n + 12, 2 * n + 14, 16)[stage]
''',
}

WRONG = {
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
