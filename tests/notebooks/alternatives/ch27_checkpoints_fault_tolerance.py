"""Chapter 27: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # a one-thread pool's future instead of a Thread, copy.deepcopy as the snapshot, the commit written out (an
    # all-reduce of finished writers as the agreement, the rename and `latest` by hand)
    "27.1": '''
import copy
from concurrent.futures import ThreadPoolExecutor
hidden = os.path.join(save_dir, f".{tag}.tmp")
os.makedirs(hidden, exist_ok=True)
pool = ThreadPoolExecutor(max_workers=1)
job = pool.submit(write, os.path.join(hidden, ch27.shard_name(rank)), copy.deepcopy(state))

def commit():
    job.result()
    pool.shutdown()
    done = torch.ones(1)
    torch.distributed.all_reduce(done)
    if rank == 0:
        os.rename(hidden, os.path.join(save_dir, tag))
        with open(os.path.join(save_dir, ".latest.aside"), "w") as f:
            f.write(tag)
        os.replace(os.path.join(save_dir, ".latest.aside"), os.path.join(save_dir, "latest"))
    torch.distributed.barrier()

return commit
''',
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
    # synchronous: the shard written before the call returns (the checkpoint is right, but the step waits for
    # the whole write, 0.4 and 0.8 s; the stall check fails)
    {"27.1": '''
hidden = os.path.join(save_dir, f".{tag}.tmp")
os.makedirs(hidden, exist_ok=True)
write(os.path.join(hidden, ch27.shard_name(rank)), state)

def commit():
    torch.distributed.barrier()
    if rank == 0:
        sharded.commit(save_dir, hidden, tag, True)
    torch.distributed.barrier()

return commit
'''},
    # no copy: the writer saves `state` itself, after the next step has changed it (the shards hold the weights
    # of the step after the save)
    {"27.1": '''
hidden = os.path.join(save_dir, f".{tag}.tmp")
os.makedirs(hidden, exist_ok=True)
writer = threading.Thread(target=write, args=(os.path.join(hidden, ch27.shard_name(rank)), state))
writer.start()

def commit():
    writer.join()
    torch.distributed.barrier()
    if rank == 0:
        sharded.commit(save_dir, hidden, tag, True)
    torch.distributed.barrier()

return commit
'''},
    # DeepSpeed's DataStatesCheckpointEngine order: each rank waits for its own writer only, so rank 0 renames the
    # folder while rank 1 is still writing (rank 1's shard is missing from the visible checkpoint)
    {"27.1": '''
snapshot = {k: v.clone() for k, v in state.items()}
hidden = os.path.join(save_dir, f".{tag}.tmp")
os.makedirs(hidden, exist_ok=True)
writer = threading.Thread(target=write, args=(os.path.join(hidden, ch27.shard_name(rank)), snapshot))
writer.start()

def commit():
    writer.join()
    if rank == 0:
        sharded.commit(save_dir, hidden, tag, True)

return commit
'''},
    # `latest` moved when the save starts, not when it is committed: a reader sees a tag whose files are still
    # being written
    {"27.1": '''
snapshot = {k: v.clone() for k, v in state.items()}
hidden = os.path.join(save_dir, f".{tag}.tmp")
os.makedirs(hidden, exist_ok=True)
writer = threading.Thread(target=write, args=(os.path.join(hidden, ch27.shard_name(rank)), snapshot))
writer.start()
if rank == 0:
    with open(os.path.join(save_dir, "latest"), "w") as f:
        f.write(tag)

def commit():
    writer.join()
    torch.distributed.barrier()
    if rank == 0:
        os.rename(hidden, os.path.join(save_dir, tag))
    torch.distributed.barrier()

return commit
'''},
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
