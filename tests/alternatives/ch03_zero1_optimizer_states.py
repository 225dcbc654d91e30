"""Chapter 3: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # math.ceil instead of negative floor division, and a list instead of a tuple
    "3.1": '''
import math
shard = max(1, math.ceil(numel / world_size))
return [rank * shard, (rank + 1) * shard]
''',
    # the mean taken by the collective (op="avg"), reduced in place into this rank's slice of the gradient,
    # Adam on a copy of the shard, then the copy all-gathered into the full buffer
    "3.3": '''
shard = flat_param.numel() // world_size
lo, hi = rank * shard, (rank + 1) * shard
mean_grad = flat_grad[lo:hi]                      # a view: the reduce-scatter writes the mean over ranks here
comm.reduce_scatter(mean_grad, flat_grad, op="avg")
updated = flat_param[lo:hi].clone()
adam_step_(updated, mean_grad, exp_avg, exp_avg_sq, step, adam)
comm.all_gather(flat_param, updated)
''',
}

WRONG = {
    # shard_start measured from the start of the buffer instead of the start of the shard
    "3.2": '''
shard = max(1, -(-sum(numels) // world_size))
lo, hi = rank * shard, (rank + 1) * shard
out, offset = [], 0
for i, n in enumerate(numels):
    a, b = max(lo, offset), min(hi, offset + n)
    if a < b:
        out.append((i, a - offset, b - offset, a))
    offset += n
return out
''',
}
