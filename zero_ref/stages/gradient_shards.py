"""Stages 2 and 3: no rank keeps a full gradient, only its shard of the sum over ranks.

As backward produces a parameter's gradient, it is copied into its bucket's staging buffer and freed.
Once the bucket is complete, one reduce-scatter hands rank r the sum of shard r of the buffer, and rank r
adds it into its gradient partition (``partition.grad``; on the host under offload), which accumulates
over micro-steps until the optimizer step reads and clears it. ZeRO-2 reduces one bucket per collective;
ZeRO-3 puts several units' staged gradients into one buffer first (``zero3.ReduceGroup``).
"""
from __future__ import annotations

import torch

from zero_ref import comm
from zero_ref.stages.partition import Partition


class GradientShards:
    """The gradient path of stage ``opt``: its group, ``overlap_comm``, offload and collectives in flight."""

    def __init__(self, opt):
        self.opt = opt
        self.staging: dict[int, torch.Tensor] = {}  # id(bucket) -> this backward's gradients, until reduced

    def stage(self, b, i: int, param: torch.Tensor) -> None:
        """Parameter ``i`` of bucket ``b`` has its gradient: copy it into b's staging buffer and free it."""
        staging = self.staging.get(id(b))
        if staging is None:
            staging = self.staging[id(b)] = param.grad.new_zeros(b.layout.padded_numel)
        start, n = b.layout.offsets[i], b.layout.numels[i]
        staging[start:start + n].copy_(param.grad.reshape(-1))
        param.grad = None  # the full gradient is freed as soon as it is staged

    def take(self, b, dtype: torch.dtype, device) -> torch.Tensor:
        """Bucket ``b``'s staged gradients, now out of the stage's hands (zeros for parameters that got none)."""
        staging = self.staging.pop(id(b), None)
        return staging if staging is not None else torch.zeros(b.layout.padded_numel, dtype=dtype, device=device)

    def reduce(self, flat: torch.Tensor, into: list[tuple[Partition, int]]) -> None:
        """Reduce-scatter ``flat`` (ranks' shards end to end); once done, add piece ``offset`` of this rank's
        shard into each ``(partition, offset)`` of ``into``."""
        opt = self.opt
        n = flat.numel() // opt.world_size
        mine = flat[opt.rank * n:(opt.rank + 1) * n]
        work = comm.reduce_scatter(mine, flat, group=opt.group, async_op=opt.overlap_comm)

        def then():  # accumulates over micro-steps (on the host under offload)
            for part, offset in into:
                piece = mine[offset:offset + part.numel]
                if opt.offload is not None:
                    opt.offload.add_grad(part, piece)
                else:
                    part.grad.add_(piece)
        opt._async(work, then)

    def averaged(self, parts: list[Partition]) -> list[torch.Tensor]:
        """fp32, each partition's gradient averaged over ranks (what Adam reads)."""
        if self.opt.offload is not None:
            return self.opt.offload.grad_partitions(parts, 1.0 / self.opt.world_size)
        return [self.opt.averaged(part.grad) for part in parts]

    @staticmethod
    def clear(parts: list[Partition]) -> None:
        for part in parts:
            part.grad.zero_()
