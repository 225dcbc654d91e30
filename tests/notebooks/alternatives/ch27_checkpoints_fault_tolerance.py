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
    # agreement by a count of finished ranks (an all-reduce) instead of a barrier; `latest` written aside with
    # tempfile; the hidden folder named by rank 0 and broadcast
    "27.3": '''
import tempfile
name = [f".{tag}.writing-{os.urandom(4).hex()}" if rank == 0 else None]
torch.distributed.broadcast_object_list(name, src=0)
aside = os.path.join(save_dir, name[0])
os.makedirs(aside, exist_ok=True)
write(os.path.join(aside, ch27.shard_name(rank)))
done = torch.ones(1)
torch.distributed.all_reduce(done)
assert done.item() == world
if rank == 0:
    os.replace(aside, os.path.join(save_dir, tag))
    fd, pointer = tempfile.mkstemp(dir=save_dir, prefix=".latest-")
    with os.fdopen(fd, "w") as f:
        f.write(tag)
    os.replace(pointer, os.path.join(save_dir, "latest"))
torch.distributed.barrier()
''',
}

WRONG = {
    # every rank writes a full shard: the padding of the last one counted as if it were written
    "27.1": '''
return 12 * -(-sum(numels) // world)
''',
}

_PIECES = '''
flat = torch.zeros(sum(n for _, n in params))
offset = 0
for name, n in params:
    for start, t in pieces[name]:
        flat[offset + start:offset + start + t.numel()] = t
    offset += n
'''

MORE_WRONG = [
    # the padding left out: the last of four ranks gets 3,300 elements instead of 3,303
    {"27.2": _PIECES + '''
shard = -(-flat.numel() // world)
return flat[rank * shard:(rank + 1) * shard].clone()
'''},
    # the shard size rounded down: 3,302 elements per rank, every rank's slice shifted
    {"27.2": _PIECES + '''
shard = flat.numel() // world
return flat[rank * shard:(rank + 1) * shard].clone()
'''},
    # DeepSpeed 0.19.8's order: straight into <tag>/, rank 0 writes `latest` without waiting for the others'
    # shards (the kill leaves `latest` on step3 with rank 1's shard torn)
    {"27.3": '''
os.makedirs(os.path.join(save_dir, tag), exist_ok=True)
write(os.path.join(save_dir, tag, ch27.shard_name(rank)))
if rank == 0:
    with open(os.path.join(save_dir, "latest"), "w") as f:
        f.write(tag)
torch.distributed.barrier()
'''},
    # the barrier, but no hidden folder: `latest` stays on step2, and a torn step3 folder is visible
    {"27.3": '''
os.makedirs(os.path.join(save_dir, tag), exist_ok=True)
write(os.path.join(save_dir, tag, ch27.shard_name(rank)))
torch.distributed.barrier()
if rank == 0:
    with open(os.path.join(save_dir, ".latest.tmp"), "w") as f:
        f.write(tag)
    os.replace(os.path.join(save_dir, ".latest.tmp"), os.path.join(save_dir, "latest"))
torch.distributed.barrier()
'''},
    # each rank names its own hidden folder: rank 0 commits a folder holding only its own shard
    {"27.3": '''
tmp = os.path.join(save_dir, f".{tag}.tmp-{os.getpid()}")
os.makedirs(tmp, exist_ok=True)
write(os.path.join(tmp, ch27.shard_name(rank)))
torch.distributed.barrier()
if rank == 0:
    os.rename(tmp, os.path.join(save_dir, tag))
    with open(os.path.join(save_dir, ".latest.tmp"), "w") as f:
        f.write(tag)
    os.replace(os.path.join(save_dir, ".latest.tmp"), os.path.join(save_dir, "latest"))
torch.distributed.barrier()
'''},
    # written aside, but rank 0 commits before the barrier: it does not wait for rank 1's shard
    {"27.3": '''
tmp = os.path.join(save_dir, f".{tag}.tmp")
os.makedirs(tmp, exist_ok=True)
write(os.path.join(tmp, ch27.shard_name(rank)))
if rank == 0:
    os.rename(tmp, os.path.join(save_dir, tag))
    with open(os.path.join(save_dir, ".latest.tmp"), "w") as f:
        f.write(tag)
    os.replace(os.path.join(save_dir, ".latest.tmp"), os.path.join(save_dir, "latest"))
torch.distributed.barrier()
'''},
]
