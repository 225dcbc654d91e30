"""Chapter 1: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # integer bytes and a table of divisors instead of in-place division; returns a float all the same
    "1.1": '''
shards = [(1, 1, 1), (1, 1, n_d), (1, n_d, n_d), (n_d, n_d, n_d)][stage]   # params, grads, optimizer
return sum(b * psi / d for b, d in zip((2, 2, k), shards)) / 10**9
''',
    # the same fraction written as 1 - useful / total time
    "1.2": '''
return 1 - m / (m + p - 1)
''',
}

WRONG = {
    # "ZeRO-3 always helps": answers stage 3 where nothing fits
    "1.3": '''
return next((s for s in range(4) if zero_memory_gb(psi, n_gpus, s) <= gpu_gb), 3)
''',
}
