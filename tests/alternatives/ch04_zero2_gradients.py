"""Chapter 4: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the buckets closed by a running total over the reversed indices, as tuples
    "4.1": '''
plan, start_size, current = [], 0, ()
for i in range(len(numels) - 1, -1, -1):
    if current and start_size + numels[i] > bucket_size:
        plan.append(current)
        current, start_size = (), 0
    current += (i,)
    start_size += numels[i]
return plan + [current] if current else plan
''',
}

WRONG = {
    # the reduced shard written over the partition: micro-steps do not accumulate
    "4.2": '''
comm.reduce_scatter(partition, staging)
''',
}
