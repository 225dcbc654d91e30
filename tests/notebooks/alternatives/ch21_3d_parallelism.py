"""Chapter 21: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # every rank's coordinates decoded, the ranks bucketed by their other two coordinates; members as tuples
    "21.1": '''
sizes = {"tp": tp, "dp": dp, "pp": pp}
names = order.split("-")


def coords(r):
    c = {}
    for a in names:
        c[a], r = r % sizes[a], r // sizes[a]
    return c


me, out = dist.get_rank(), {}
for axis in ("pp", "tp", "dp"):
    buckets = {}
    for r in range(tp * dp * pp):
        c = coords(r)
        buckets.setdefault(tuple(c[a] for a in names if a != axis), []).append((c[axis], r))
    for key in sorted(buckets, key=lambda k: min(r for _, r in buckets[k])):
        members = tuple(r for _, r in sorted(buckets[key]))
        handle = dist.new_group(list(members))
        if me in members:
            out[axis] = (members, handle)
return out
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
    # the grid copied from Topology (the printed grid's source): switched off on the ranks
    {"21.1": '''
from zero_ref.parallel.topology import Topology as Grid
grid, me = Grid(tp=tp, dp=dp, pp=pp, order=order), dist.get_rank()
mine = {}
for axis in ("tp", "dp", "pp"):
    for members in grid.groups(axis):
        handle = dist.new_group(members)
        if me in members:
            mine[axis] = (members, handle)
return mine
'''},
    # `order` read slowest-varying first: right for symmetric layouts only
    {"21.1": '''
sizes = {"tp": tp, "dp": dp, "pp": pp}
stride, s = {}, 1
for a in reversed(order.split("-")):
    stride[a], s = s, s * sizes[a]
me, mine = dist.get_rank(), {}
for axis in ("tp", "dp", "pp"):
    a, b = (x for x in ("tp", "dp", "pp") if x != axis)
    for i in range(sizes[a]):
        for j in range(sizes[b]):
            members = [i * stride[a] + j * stride[b] + k * stride[axis] for k in range(sizes[axis])]
            handle = dist.new_group(members)
            if me in members:
                mine[axis] = (members, handle)
return mine
'''},
    # each axis's stride taken as the size of the axis before it, not the product of all faster axes
    {"21.1": '''
sizes = {"tp": tp, "dp": dp, "pp": pp}
names = order.split("-")
stride = {names[0]: 1, names[1]: sizes[names[0]], names[2]: sizes[names[1]]}
me, mine = dist.get_rank(), {}
for axis in ("tp", "dp", "pp"):
    a, b = (x for x in ("tp", "dp", "pp") if x != axis)
    for i in range(sizes[a]):
        for j in range(sizes[b]):
            members = [i * stride[a] + j * stride[b] + k * stride[axis] for k in range(sizes[axis])]
            handle = dist.new_group(members)
            if me in members:
                mine[axis] = (members, handle)
return mine
'''},
    # the right members, but the handle kept is the axis's last group created, not this rank's
    {"21.1": '''
sizes = {"tp": tp, "dp": dp, "pp": pp}
stride, s = {}, 1
for a in order.split("-"):
    stride[a], s = s, s * sizes[a]
me, mine = dist.get_rank(), {}
for axis in ("tp", "dp", "pp"):
    a, b = (x for x in ("tp", "dp", "pp") if x != axis)
    for i in range(sizes[a]):
        for j in range(sizes[b]):
            members = [i * stride[a] + j * stride[b] + k * stride[axis] for k in range(sizes[axis])]
            handle = dist.new_group(members)
            if me in members:
                own = members
    mine[axis] = (own, handle)
return mine
'''},
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
