"""ZeRO++ hpZ: a secondary copy of each unit partitioned within a node, so backward's gathers stay inside it.

With ``zero_hpz_partition_size`` g, the ranks form sub-groups of g consecutive ranks (``subgroups``). Rank r
keeps, besides its primary shard (1/N of the unit), the slice ``r mod g`` of g of the full buffer. As in
DeepSpeed 0.19.8, no collective makes it: the first gather after an optimizer step comes from the primary
(all N ranks), and when that gather is released the rank keeps its slice (``_partition_param_sec`` in
runtime/zero/partition_parameters.py); later gathers (backward, further micro-steps) all-gather the
secondary inside the sub-group, until the step invalidates it (``invalidate_secondary_tensor``, stage3.py).
Memory per rank: 2Ψ/N + 2Ψ/g bytes of fp16 parameters instead of 2Ψ/N (the paper's count).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from zero_ref import comm
from zero_ref.stages.zero3.quantized_gather import quantized_all_gather


def subgroups(ranks: list[int], size: int) -> list[list[int]]:
    """``ranks`` cut into consecutive sub-groups of ``size`` (DeepSpeed's ``_create_zero_param_parallel_group``).

    >>> subgroups([0, 1, 2, 3], 2)
    [[0, 1], [2, 3]]
    """
    if size < 1 or len(ranks) % size:
        raise ValueError(f"zero_hpz_partition_size {size} must divide the {len(ranks)} data-parallel ranks")
    return [ranks[i:i + size] for i in range(0, len(ranks), size)]


def new_subgroups(group, size: int):
    """Create every sub-group (each rank must call this, in the same order); return this rank's and its size."""
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    mine = None
    for sub in subgroups(ranks, size):
        g = dist.new_group(sub)
        if dist.get_rank() in sub:
            mine = g
    return mine


class UnitGather:
    """How ZeRO++ gathers one unit: from the primary shard over all ranks, or from the secondary slice inside
    the sub-group (hpZ); through int8 blocks or not (qwZ)."""

    def __init__(self, quantize: bool, subgroup=None):
        self.quantize, self.subgroup = quantize, subgroup
        self.secondary: torch.Tensor | None = None  # this rank's slice of the full buffer within the sub-group

    def gather(self, unit) -> None:
        """``unit.full`` ← the whole unit."""
        if self.secondary is not None:
            part, group = self.secondary, self.subgroup
        else:
            part, group = unit.device_part(), unit.group
        if self.quantize:
            quantized_all_gather(unit.full, part, group=group)
        else:
            comm.all_gather(unit.full, part, group=group)

    def keep_secondary(self, unit) -> None:
        """``unit.full`` holds this step's values: keep the sub-group slice if none is kept yet."""
        if self.subgroup is not None and self.secondary is None:
            g, r = dist.get_world_size(self.subgroup), dist.get_rank(self.subgroup)
            n = unit.size // g
            self.secondary = unit.full[r * n:(r + 1) * n].clone()

    def invalidate(self) -> None:
        self.secondary = None
