"""Chapter 1: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # integer bytes and a table of divisors instead of in-place division; returns a float all the same
    "1.1": '''
shards = [(1, 1, 1), (1, 1, n_d), (1, n_d, n_d), (n_d, n_d, n_d)][stage]   # params, grads, optimizer
return sum(b * psi / d for b, d in zip((2, 2, k), shards)) / 10**9
''',
    # the schedule as a recurrence: an op begins when the op before it on its stage and its input have finished
    "1.2": '''
from functools import lru_cache

def order(s):
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m - 1, -1, -1)]
    w = min(p - s - 1, m)
    out = [("F", i) for i in range(w)]
    for k in range(m - w):
        out += [("F", w + k), ("B", k)]
    return out + [("B", i) for i in range(m - w, m)]

orders = [order(s) for s in range(p)]
position = {(s, kind, i): n for s in range(p) for n, (kind, i) in enumerate(orders[s])}

@lru_cache(maxsize=None)
def finish(s, kind, i):
    return begin(s, kind, i) + (t_f if kind == "F" else t_b)

@lru_cache(maxsize=None)
def begin(s, kind, i):
    n = position[s, kind, i]
    t = finish(s, *orders[s][n - 1]) if n else 0
    if kind == "F" and s > 0:
        t = max(t, finish(s - 1, "F", i))
    if kind == "B":
        t = max(t, finish(s, "F", i) if s == p - 1 else finish(s + 1, "B", i))
    return t

return {(s, kind, i): begin(s, kind, i) for s in range(p) for kind, i in orders[s]}
''',
}

WRONG = {
    # "ZeRO-3 always helps": answers stage 3 where nothing fits
    "1.3": '''
return next((s for s in range(4) if zero_memory_gb(psi, n_gpus, s) <= gpu_gb), 3)
''',
}
