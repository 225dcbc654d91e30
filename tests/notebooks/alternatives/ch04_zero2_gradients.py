"""Chapter 4: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # one flat staging buffer for all buckets, bucket b at starts[b]; the launch walks a pointer over complete buckets
    "4.1": '''
sizes = [sum(numels[i] for i in members) for members in buckets]
padded = [-(-size // world_size) * world_size for size in sizes]
starts = [sum(padded[:b]) for b in range(len(buckets))]
offset = {}
for b, members in enumerate(buckets):
    at = starts[b]
    for i in members:
        offset[i] = (b, at)
        at += numels[i]
flat = torch.zeros(sum(padded))
arrived = [set() for _ in buckets]
state = {"next": 0, "out": []}

def ready(i, grad):
    b, at = offset[i]
    flat[at:at + numels[i]].copy_(grad.flatten())
    arrived[b].add(i)
    while state["next"] < len(buckets) and len(arrived[state["next"]]) == len(buckets[state["next"]]):
        b = state["next"]
        out = torch.zeros(padded[b] // world_size)
        comm.reduce_scatter(out, flat[starts[b]:starts[b] + padded[b]])
        state["out"].append(out / world_size)
        state["next"] += 1

def finish():
    return list(state["out"])

return ready, finish
''',
}

WRONG = {
    # the reduced shard written over the partition: micro-steps do not accumulate
    "4.2": '''
comm.reduce_scatter(partition, staging)
''',
}
