"""ZeRO-3's partitioned parameter: a ``Unit`` of parameters sharded together, gathered and released on demand.

Rank r keeps shard r of the unit's flat padded buffer (``unit.part``); between uses every ``param.data`` is
empty. ``gather()`` all-gathers the full buffer and makes the parameters views into it, ``release()``
empties them again. ``unit_of(p)`` is the unit a parameter belongs to (None if it is not partitioned).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from zero_ref import comm
from zero_ref.stages.flat import FlatLayout


def unit_of(p: torch.Tensor) -> "Unit | None":
    """The ``Unit`` that partitions parameter ``p``, or None."""
    return getattr(p, "_z3_unit", None)


class Unit:
    """Parameters partitioned together: rank r keeps shard r (``part``) of their flat padded buffer."""

    def __init__(self, name: str, params: list[nn.Parameter], group=None):
        self.name, self.params, self.group = name, params, group
        self.rank = dist.get_rank(group)
        self.device = params[0].device  # where the gathered parameters compute
        self.offload = None  # a ``zero_ref.offload.ParamOffload`` when ``part`` lives on the host or in a file
        self.zeropp = None   # a ``secondary_partition.UnitGather`` under ZeRO++ (qwZ, hpZ)
        self.layout = FlatLayout([p.shape for p in params], dist.get_world_size(group))
        self.part = torch.zeros(self.layout.shard_numel, dtype=params[0].dtype, device=params[0].device)
        for pc in self.layout.pieces(self.rank):  # copy just our slices: no full flat copy is made
            self.part[pc.shard_start:pc.shard_start + pc.numel] = \
                params[pc.index].detach().reshape(-1)[pc.param_start:pc.param_end]
        self.full = self.work = None  # the gathered buffer (None when released); an all-gather in flight
        # other copies of this rank's shard, kept up to date by repartition(): a stage's fp32 master
        self.on_repartition: list[Callable[[torch.Tensor], None]] = []
        for p in params:
            p._z3_unit = self  # what unit_of(p) reads
        self.release()

    numel = property(lambda self: self.layout.numel)       # real elements
    size = property(lambda self: self.layout.padded_numel)  # elements once gathered

    def shard(self, flat: torch.Tensor) -> torch.Tensor:
        return self.layout.shard(flat, self.rank)

    def empty(self, n: int) -> torch.Tensor:
        """An uninitialized buffer of ``n`` elements in the unit's dtype, on its compute device."""
        return torch.empty(n, dtype=self.part.dtype, device=self.device)

    def device_part(self) -> torch.Tensor:
        """This rank's shard on the compute device: ``part``, or a copy in from the host / NVMe (offload_param)."""
        return self.part if self.offload is None else self.offload.fetch(self)

    def gather(self, async_op: bool = False) -> None:
        self.full = self.empty(self.size)
        if self.zeropp is not None:  # ZeRO++: quantized and/or from the secondary partition (synchronous)
            self.zeropp.gather(self)
            return self.wait()
        self.work = comm.all_gather(self.full, self.device_part(), group=self.group, async_op=async_op)
        if not async_op:
            self.wait()

    def wait(self) -> None:
        """Finish an all-gather in flight; the parameters become views into the full buffer."""
        if self.work is not None:
            self.work.wait()
            self.work = None
        for p, view in zip(self.params, self.layout.unflatten(self.full)):
            p.data = view

    def release(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work = None
        if self.zeropp is not None and self.full is not None:
            self.zeropp.keep_secondary(self)  # hpZ: this step's values, before they go
        self.full = None
        for p in self.params:
            p.data = self.empty(0)

    def take_from(self, rank: int = 0) -> None:
        """Every rank takes group rank ``rank``'s gathered values (a broadcast of the full buffer)."""
        src = rank if self.group is None else dist.get_global_rank(self.group, rank)
        comm.broadcast(self.full, src=src, group=self.group)

    def repartition(self) -> None:
        """Keep this rank's shard of the (edited) full buffer, and hand it to ``on_repartition``."""
        shard = self.shard(self.full)
        if self.zeropp is not None:
            self.zeropp.invalidate()  # edited values: the secondary copy is stale
        for keep in self.on_repartition:  # first: one that refuses leaves the partition as it was
            keep(shard)
        if self.offload is not None:
            self.offload.write_part(self, shard)
        else:
            self.part.copy_(shard)
