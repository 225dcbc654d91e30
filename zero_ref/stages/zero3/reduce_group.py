"""ZeRO-3's gradient buckets: units whose gradients share one reduce-scatter."""
from __future__ import annotations

import torch


class ReduceGroup:
    """Units whose gradients are reduce-scattered in one collective: consecutive in the order backward completes
    them, at most ``reduce_bucket_size`` elements together (a larger unit alone), as DeepSpeed fills its
    ``reduce_bucket_size`` bucket in stage 3. The buffer is (ranks × their shards end to end): row r holds every
    unit's shard r, so one reduce-scatter hands rank r all of its shards."""

    def __init__(self, units: list, world_size: int):
        self.units, self.world_size = units, world_size
        self.offsets, self.shard_numel = {}, 0  # each unit's shard within a row; a row's length
        for u in units:
            self.offsets[u] = self.shard_numel
            self.shard_numel += u.layout.shard_numel
        self.flat: torch.Tensor | None = None  # this backward's gradients, filled unit by unit
        self.filled = 0

    def put(self, u, staging: torch.Tensor) -> torch.Tensor | None:
        """Unit ``u``'s staged gradients; the group's full buffer once the last is in, else None."""
        if len(self.units) == 1:
            return staging
        if self.flat is None:
            self.flat = staging.new_empty(self.world_size * self.shard_numel)
        start, n = self.offsets[u], u.layout.shard_numel
        self.flat.view(self.world_size, -1)[:, start:start + n].copy_(staging.view(self.world_size, n))
        self.filled += 1
        if self.filled < len(self.units):
            return None
        flat, self.flat, self.filled = self.flat, None, 0
        return flat

    def reset(self) -> None:
        self.flat, self.filled = None, 0


def reduce_groups(units: list, bucket_size: int, world_size: int) -> list[ReduceGroup]:
    """``units`` (in launch order) cut into groups of at most ``bucket_size`` elements once gathered."""
    groups, current, size = [], [], 0
    for u in units:
        if current and size + u.size > bucket_size:
            groups.append(ReduceGroup(current, world_size))
            current, size = [], 0
        current.append(u)
        size += u.size
    groups.append(ReduceGroup(current, world_size))
    return groups
