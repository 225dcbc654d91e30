"""Chapter 17: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # replay the ring's schedule chunk by chunk and add up what this rank sends
    "17.1": '''
if n == 1:
    return 0
sizes = [numel // n + (c < numel % n) for c in range(n)]
sent = sum(sizes[(rank - k) % n] for k in range(n - 1))         # reduce-scatter: step k sends chunk r - k
sent += sum(sizes[(rank + 1 - k) % n] for k in range(n - 1))    # all-gather: step k sends chunk r + 1 - k
return sent * itemsize
''',
}

WRONG = {
    # the tree's latency steps without the ceiling: log2(n) rounds on a non-power-of-two n
    "17.2": '''
latency_gap = (n - 1 - math.log2(n)) * alpha
if tree_efficiency >= 1:
    return math.inf
if latency_gap <= 0:
    return 0.0
return latency_gap * bandwidth * n / ((n - 1) * (1 / tree_efficiency - 1))
''',
    # least squares on absolute errors: the large messages dominate the fit
    "17.3": '''
terms = np.array([alpha_beta_terms(s["op"], s["bytes"], s["group_size"]) for s in samples])
t = np.array([s["seconds"] for s in samples])
alpha, inv_bw = np.linalg.lstsq(terms, t, rcond=None)[0]
return float(alpha), float(1 / inv_bw)
''',
}
