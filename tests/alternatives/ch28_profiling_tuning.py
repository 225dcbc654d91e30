"""Chapter 28: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # FLOPs per token first, the hardware count as a multiple of the model count; a list, not a tuple
    "28.1": '''
per_token = 6 * params
hardware_factor = 8 / 6 if recompute == "full" else 1
mfu = per_token * tokens / (step_time * devices * peak_flops)
return [mfu, mfu * hardware_factor]
''',
}

WRONG = {
    # the element-wise (memory-bound) time forgotten: the whole phase charged to the GEMMs
    "28.2": '''
return flops / (peak_flops * compute_seconds)
''',
}
