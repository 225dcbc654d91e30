"""Chapter 22: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # one expression, in float bytes: the activations forward, their gradients back, the tied embedding twice
    "22.1": '''
act = 4.0 * micro * seq * hidden
sends = m * act * ((stage < pp - 1) + (stage > 0))
tied = 4.0 * embedding_shard if pp > 1 and stage in (0, pp - 1) else 0.0
return 32.0 + sends + tied
''',
}

WRONG = {
    # micro-batches dealt round-robin over the replicas instead of one contiguous slice per replica
    "22.2": '''
if global_batch % (dp * m):
    raise ValueError(f"{global_batch} does not divide into {dp} × {m}")
micro = global_batch // (dp * m)
return [[((i * dp + d) * micro, (i * dp + d + 1) * micro) for i in range(m)] for d in range(dp)]
''',
}
