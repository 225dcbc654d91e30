"""Chapter 17: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG, MORE_WRONG
must fail)."""

RIGHT = {
    # one loop of 2(n − 1) steps over a list of chunk indices, a fresh receive buffer at each step, and the
    # schedule rotated by one: rank r ends the reduce-scatter owning chunk r (its ranks send the same bytes in
    # another order)
    "17.1": '''
n, r = comm.get_world_size(), comm.get_rank()
parts = list(torch.tensor_split(tensor.view(-1), n))
schedule = [((r - k - 1) % n, (r - k - 2) % n, True) for k in range(n - 1)]
schedule += [((r - k) % n, (r - k - 1) % n, False) for k in range(n - 1)]
for out, into, reduce in schedule:
    got = torch.empty_like(parts[into])
    handles = [comm.isend(parts[out], dst=(r + 1) % n), comm.irecv(got, src=(r + n - 1) % n)]
    for h in reversed(handles):
        h.wait()
    if reduce:
        parts[into] += got
    else:
        parts[into].copy_(got)
return tensor
''',
    # the 2 × 2 normal equations of the relative fit, solved by hand
    "17.4": '''
saa = sab = sbb = sa = sb = 0.0
for s in samples:
    op = "all_reduce" if s["op"] in ("all_reduce", "reduce_scatter") else s["op"]
    k, w = alpha_beta_terms(op, s["bytes"], s["group_size"])
    x, y = k / s["seconds"], w / s["seconds"]
    saa, sab, sbb, sa, sb = saa + x * x, sab + x * y, sbb + y * y, sa + x, sb + y
det = saa * sbb - sab * sab
alpha, inv_bw = (sa * sbb - sb * sab) / det, (saa * sb - sab * sa) / det
return alpha, 1 / inv_bw
''',
    # replay the ring's schedule chunk by chunk and add up what this rank sends
    "17.2": '''
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
    "17.3": '''
latency_gap = (n - 1 - math.log2(n)) * alpha
if tree_efficiency >= 1:
    return math.inf
if latency_gap <= 0:
    return 0.0
return latency_gap * bandwidth * n / ((n - 1) * (1 / tree_efficiency - 1))
''',
}

MORE_WRONG = [
    # a ring that passes whole buffers: the right sum, but (n − 1)·S bytes per rank instead of 2(n − 1)/n·S
    {"17.1": '''
n, r = comm.get_world_size(), comm.get_rank()
passing, incoming = tensor.clone(), torch.empty_like(tensor)
for _ in range(n - 1):
    work = comm.isend(passing, dst=(r + 1) % n)
    comm.irecv(incoming, src=(r - 1) % n).wait()
    work.wait()
    tensor += incoming
    passing = incoming.clone()
return tensor
'''},
    # the all-gather sends the chunk one step behind (r − k instead of r + 1 − k): stale partial sums spread
    {"17.1": '''
n, r = comm.get_world_size(), comm.get_rank()
chunks = tensor.view(-1).tensor_split(n)
buf = torch.empty_like(chunks[0])
for k in range(n - 1):
    send, recv = chunks[(r - k) % n], chunks[(r - k - 1) % n]
    work = comm.isend(send, dst=(r + 1) % n)
    comm.irecv(buf[:recv.numel()], src=(r - 1) % n).wait()
    work.wait()
    recv.add_(buf[:recv.numel()])
for k in range(n - 1):
    work = comm.isend(chunks[(r - k) % n], dst=(r + 1) % n)
    comm.irecv(chunks[(r - k - 1) % n], src=(r - 1) % n).wait()
    work.wait()
return tensor
'''},
    # the library call the task replaces: refused while the check runs
    {"17.1": '''
comm.all_reduce(tensor)
return tensor
'''},
]

# the library's ring, which the task rebuilds: refused while the check runs
MORE_WRONG.append({"17.1": '''
return ca.ring_all_reduce_(tensor)
'''})

# the ring model the library assumes: gloo's reduce-scatter timed as a ring reduce-scatter
MORE_WRONG[0]["17.4"] = '''
ring = fit_alpha_beta(samples)
return ring.alpha, ring.bandwidth
'''

# least squares on absolute errors (gloo's algorithms): the large messages dominate the fit
MORE_WRONG[1]["17.4"] = '''
ran = lambda op: "all_reduce" if op == "reduce_scatter" else op
terms = np.array([alpha_beta_terms(ran(s["op"]), s["bytes"], s["group_size"]) for s in samples])
t = np.array([s["seconds"] for s in samples])
alpha, inv_bw = np.linalg.lstsq(terms, t, rcond=None)[0]
return float(alpha), float(1 / inv_bw)
'''

# every chunk taken to hold numel // n elements: wrong as soon as n does not divide the buffer
MORE_WRONG[2]["17.2"] = '''
return itemsize * 2 * (n - 1) * (numel // n)
'''
