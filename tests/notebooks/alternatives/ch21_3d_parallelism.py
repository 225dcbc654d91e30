"""Chapter 21: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # decode every rank's coordinates and bucket the ranks by the other two axes; groups as tuples
    "21.1": '''
sizes = {"tp": tp, "dp": dp, "pp": pp}
names = order.split("-")
buckets = {}
for r in range(tp * dp * pp):
    coords, rest = {}, r
    for a in names:
        coords[a], rest = rest % sizes[a], rest // sizes[a]
    buckets.setdefault(tuple(coords[a] for a in names if a != axis), []).append(r)
return sorted((tuple(g) for g in buckets.values()), key=lambda g: g[0])
''',
}

# Task 21.2 decided in the simulator: the fastest grid that fits, among all powers of two
RIGHT["21.2"] = '''
best = None
for tp in (1, 2, 4, 8):
    for pp in (1, 2, 4, 8, 16, 32):
        if 32 % (tp * pp):
            continue
        dp = 32 // (tp * pp)
        r = sim.simulate(sim.Model.preset("llama-65b"), sim.Cluster.preset("A100-80GB", nodes=4),
                         sim.Plan(tp=tp, pp=pp, dp=dp, micro_batch_size=1, num_microbatches=64 // dp, zero_stage=1))
        if r.fits and (best is None or r.step_time < best[0]):
            best = (r.step_time, dict(tp=tp, pp=pp, dp=dp))
PLAN = best[1]
'''

# Task 21.3: blocking calls ordered by stage (the first end sends first, the last receives first)
RIGHT["21.3"] = '''
if num_stages > 1 and stage in (0, num_stages - 1):
    theirs = torch.zeros_like(grad)
    if stage == 0:
        comm.send(grad, ranks[-1])
        comm.recv(theirs, ranks[-1])
    else:
        comm.recv(theirs, ranks[0])
        comm.send(grad, ranks[0])
    grad += theirs
'''

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # "tp fills the node": tp = 8 fits easily, but each rank's matrix products are half as wide and
    # the all-reduces span twice as many ranks: 7 % slower than tp 4 with pp 8
    {"21.2": '''
PLAN = dict(tp=8, pp=4, dp=1)
'''},
    # more data parallelism for a faster step: tp 4 × pp 4 × dp 2 is faster but needs 83 GiB per GPU
    {"21.2": '''
PLAN = dict(tp=4, pp=4, dp=2)
'''},
    # the most tensor parallelism to save memory: tp = 16 leaves the node (50 % slower)
    {"21.2": '''
PLAN = dict(tp=16, pp=2, dp=1)
'''},
]
