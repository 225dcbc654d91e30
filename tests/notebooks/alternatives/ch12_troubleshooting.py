"""Chapter 12: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the fingerprint exchanged as a Python object (torch's all_gather_object pickles it to a fixed-size
    # byte tensor itself), compared as strings
    "12.1": '''
import torch.distributed as dist
calls = [None] * comm.get_world_size(group)
dist.all_gather_object(calls, describe(tensor), group=group)
if len(set(calls)) > 1:
    raise ValueError(", ".join(f"rank {r} {c}" for r, c in enumerate(calls)))
comm.all_reduce(tensor, group=group)
return tensor
''',
    # every rank draws from its own generator, all draws are gathered, and step s uses rank (s mod n)'s draw
    "12.4": '''
mine = torch.rand(LCFG.n_layers, generator=rng)
everyone = torch.empty(world_size * LCFG.n_layers)
comm.all_gather(everyone, mine)
chosen = everyone.view(world_size, LCFG.n_layers)[step % world_size]
return [bool(u >= P_DROP) for u in chosen.tolist()]
''',
}

WRONG = {
    # blames the rank that is about to gather the skipped block (the one left waiting), not the one that skipped it
    "12.3": '''
words = message.split("'")
first_rank, first_unit = int(words[0].split("rank ")[-1].split()[0]), words[1]
second_rank, second_unit = int(words[2].split("rank ")[-1].split()[0]), words[3]
order = [n for n, _ in model.named_modules()]
rank, unit = min((first_rank, first_unit), (second_rank, second_unit), key=lambda ru: order.index(ru[1]))
return rank, ".".join(unit.split(".")[:2])
''',
    # every module whose output is bad, then the first in registration order (a parent before its child)
    "12.2": '''
bad = set()
handles = []
for name, module in model.named_modules():
    def hook(module, args, output, name=name):
        outputs = output if isinstance(output, tuple) else (output,)
        if any(torch.is_tensor(t) and not torch.isfinite(t).all() for t in outputs):
            bad.add(name)
    if name:
        handles.append(module.register_forward_hook(hook))
try:
    model(*inputs)
finally:
    for h in handles:
        h.remove()
return next((n for n, _ in model.named_modules() if n in bad), None)
''',
}

# More mistakes, each graded in a release of its own.
MORE_WRONG = [
    # the fingerprint is the element count: 2×3 against 3×2 goes through and sums garbage
    {"12.1": '''
world = comm.get_world_size(group)
n = torch.tensor([tensor.numel()])
everyone = torch.empty(world, dtype=torch.int64)
comm.all_gather(everyone, n, group=group)
if (everyone != n).any():
    name = str(tensor.dtype).removeprefix("torch.")
    raise ValueError("; ".join(f"rank {r} {name}[{int(k)}]" for r, k in enumerate(everyone)))
comm.all_reduce(tensor, group=group)
return tensor
'''},
    # the shape padded with 1s and no ndim: a scalar and a one-element vector look the same
    {"12.1": '''
world = comm.get_world_size(group)
mine = torch.ones(1 + MAX_DIMS, dtype=torch.int64)
mine[0] = DTYPES.index(tensor.dtype)
mine[1:1 + tensor.dim()] = torch.tensor(list(tensor.shape), dtype=torch.int64)
everyone = torch.empty(world, 1 + MAX_DIMS, dtype=torch.int64)
comm.all_gather(list(everyone.unbind(0)), mine, group=group)
if not (everyone == mine).all():
    raise ValueError("; ".join(f"rank {r} {str(DTYPES[int(p[0])]).removeprefix('torch.')}{[int(d) for d in p[1:] if d != 1]}"
                               for r, p in enumerate(everyone)))
comm.all_reduce(tensor, group=group)
return tensor
'''},
    # the shape without the dtype: float32[4] and float64[4] reach gloo with different byte counts
    {"12.1": '''
world = comm.get_world_size(group)
mine = torch.full((1 + MAX_DIMS,), -1, dtype=torch.int64)
mine[0] = tensor.dim()
mine[1:1 + tensor.dim()] = torch.tensor(list(tensor.shape), dtype=torch.int64)
everyone = torch.empty(world * mine.numel(), dtype=torch.int64)
comm.all_gather(everyone, mine, group=group)
prints = everyone.view(world, -1).tolist()
if any(p != prints[0] for p in prints):
    name = str(tensor.dtype).removeprefix("torch.")
    raise ValueError("; ".join(f"rank {r} {name}{p[1:1 + p[0]]}" for r, p in enumerate(prints)))
comm.all_reduce(tensor, group=group)
return tensor
'''},
    # a fixed pattern that every rank agrees on: the same block dropped at every step is not layer drop
    {"12.4": '''
return [i != 1 for i in range(LCFG.n_layers)]
'''},
    # a seed of one's own, shared by construction (the step): the ranks agree, but the flags ignore their generators
    {"12.4": '''
g = torch.Generator().manual_seed(step)
return (torch.rand(LCFG.n_layers, generator=g) >= P_DROP).tolist()
'''},
    # agreement by all-reduce (min): a block is kept only if every rank kept it, so it drops with 1 − 0.7² = 0.51
    {"12.4": '''
flags = (torch.rand(LCFG.n_layers, generator=rng) >= P_DROP).float()
comm.all_reduce(flags, op="min")
return [bool(f) for f in flags.tolist()]
'''},
    # each rank keeps its own draw: the planted fault (ZeRO-3 raises at the first step)
    {"12.4": '''
return (torch.rand(LCFG.n_layers, generator=rng) >= P_DROP).tolist()
'''},
]
