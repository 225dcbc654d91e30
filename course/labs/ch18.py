"""Chapter 18's harness: grade a hand-written ZeRO++ qgZ reduction on real ranks against zero_ref's.

Both reductions run on the same rank's gradient; a hook on ``zero_ref.comm`` tags every call with its link
(``intra``: every rank of the group is in this rank's node; ``inter``: the group crosses nodes) and its bytes.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from zero_ref import comm
from zero_ref.stages.zero3 import block_quant
from zero_ref.stages.zero3.quantized_reduce import BITS, BLOCK, QuantizedReduce, node_groups

NODE, SHARD = 2, 3_000  # 4 ranks = 2 nodes of 2; a shard that is not a multiple of the block (padding travels)


def qgz_formula(world: int, node: int = NODE, shard: int = SHARD, block: int = BLOCK) -> dict[str, int]:
    """Bytes a rank hands to each link per reduce (quantized_reduce's docstring): step 1 intra, step 2 inter."""
    nodes = world // node
    return {"intra": block_quant.quantized_bytes(nodes * shard, BITS, rows=node, block=block),
            "inter": block_quant.quantized_bytes(shard, BITS, rows=nodes, block=block) if nodes > 1 else 0}


def qgz_check(rank: int, world: int, reduce_fn) -> dict:
    """{"library"/"yours": (this rank's reduced shard, [(op, link, bytes), ...]), "exact": the fp32 sum}."""
    library = QuantizedReduce(None, NODE)
    groups = {}
    intra, inter = node_groups(list(range(world)), NODE)
    for sub in intra + inter:
        g = dist.new_group(sub)
        if rank in sub:
            groups["intra" if sub in intra else "inter"] = g
    node = rank // NODE
    gen = torch.Generator().manual_seed(rank)
    flat = torch.randn(world * SHARD, generator=gen)
    exact = flat.clone()
    dist.all_reduce(exact)
    amax = flat.abs().max()
    dist.all_reduce(amax, op=dist.ReduceOp.MAX)
    nodes, q = world // NODE, (1 << (BITS - 1)) - 1
    # int4 rounding is at most half a step, step = block max / q: step 1 sums N rounded chunks (each ≤ amax/(2q));
    # step 2 rounds M partial sums (each ≤ L·amax·(1 + 1/(2q))) once more
    bound = world * amax / (2 * q) + nodes * NODE * amax * (1 + 1 / (2 * q)) / (2 * q)
    out = {"exact": exact[rank * SHARD:(rank + 1) * SHARD], "bound": bound.item()}
    for name in ("library", "yours"):
        calls = []

        def tag(op, tensor, group):
            ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
            link = "intra" if all(r // NODE == node for r in ranks) else "inter"
            calls.append((op, link, tensor.numel() * tensor.element_size()))

        with comm.hooked(tag):
            if name == "library":
                got = torch.empty(SHARD)
                library(got, flat.clone())
            else:
                got = reduce_fn(flat.clone(), groups["intra"], groups["inter"], NODE)
        out[name] = (torch.as_tensor(got).float().reshape(-1).clone(), calls)
    return out


class _Compute(torch.autograd.Function):
    """Identity whose backward sleeps ``seconds``: a layer's backward compute, controlled (sleep frees the GIL,
    as a GPU kernel frees the host, so gloo's thread can run the all-reduce meanwhile)."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        import time
        time.sleep(ctx.seconds)
        return grad, None


class SlowStack(torch.nn.Module):
    """``layers`` linear layers of ``width``², each with ``seconds`` of backward compute."""

    def __init__(self, layers: int = 6, width: int = 512, seconds: float = 0.01):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False) for _ in range(layers))
        self.seconds = seconds

    def forward(self, x):
        for layer in self.layers:
            x = _Compute.apply(layer(x), self.seconds)
        return x.square().mean()


def overlap_timing(rank: int, world: int, repeats: int = 5, layers: int = 6, width: int = 512,
                   seconds: float = 0.01) -> dict:
    """Backward + reduction time of stage 0 with ``overlap_comm`` on and off, alternating, ``repeats`` times
    each (after one warm-up each); one bucket per layer. {overlap: [seconds, ...]}."""
    import time

    from zero_ref.stages import DataParallel
    times = {True: [], False: []}
    runs = {}
    for overlap in (True, False):
        torch.manual_seed(0)
        model = SlowStack(layers, width, seconds)
        runs[overlap] = (model, DataParallel(model, reduce_bucket_size=width * width, overlap_comm=overlap))
    x = torch.randn(8, width, generator=torch.Generator().manual_seed(rank))
    for i in range(repeats + 1):
        for overlap in (True, False):
            model, opt = runs[overlap]
            loss = model(x)
            dist.barrier()
            start = time.perf_counter()
            opt.backward(loss)
            elapsed = time.perf_counter() - start
            opt.zero_grad() if hasattr(opt, "zero_grad") else model.zero_grad()
            if i:
                times[overlap].append(elapsed)
    return times


def ddp_buckets(shapes, cap_mb=25):
    """Bucket bytes of PyTorch DDP's own assignment (reducer.cpp compute_bucket_assignment_by_size, called on meta
    tensors: no memory): the first bucket capped at 1 MiB (torch's _DEFAULT_FIRST_BUCKET_BYTES), then cap_mb MiB."""
    params = [torch.empty(s, device="meta") for s in shapes]
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, cap_mb * 2**20]
    buckets, _ = dist._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
    return [4 * sum(math.prod(shapes[i]) for i in b) for b in buckets]
