"""Chapter 27: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # assemble every parameter's flat master from its pieces, pad the bucket, then cut this rank's slice
    "27.2": '''
total = sum(n for _, n in params)
shard = -(-total // world)
flat = []
for name, n in params:
    full = torch.empty(n)
    for start, t in pieces[name]:
        full[start:start + t.numel()] = t
    flat.append(full)
padded = torch.cat(flat + [torch.zeros(shard * world - total)])
return padded[rank * shard:(rank + 1) * shard].clone()
''',
}

WRONG = {
    # every rank writes a full shard: the padding of the last one counted as if it were written
    "27.1": '''
return 12 * -(-sum(numels) // world)
''',
}
