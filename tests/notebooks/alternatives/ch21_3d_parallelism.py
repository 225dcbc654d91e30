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

WRONG = {
    # fp32 training, but an fp32 master copy counted in the optimizer states as in mixed precision
    "21.2": '''
shard = padded // dp if zero_stage >= 1 else padded
return {"params": 4 * padded, "grads": 4 * padded, "optimizer": 12 * shard}
''',
}

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
    # ZeRO-1 halves the moments whatever dp is (right at dp = 2 only)
    {"21.2": '''
return {"params": 4 * padded, "grads": 4 * padded, "optimizer": 4 * padded if zero_stage else 8 * padded}
'''},
]
