"""Process groups from a ``Topology``: the rank grid made real with ``torch.distributed.new_group``.

    topo = Topology.for_world(dist.get_world_size(), tp=2, pp=2)
    pg = build_groups(topo)              # every rank calls this, with the same topo
    comm.all_reduce(x, group=pg.tp)      # the tensor-parallel peers of this rank
    pg.coords                            # Coords(t=…, d=…, p=…) of this rank

Why every rank creates every group, in the same order: ``new_group`` is a collective over the
whole world, not over the group's members. torch names a group after how many groups this process
created before it and finishes creation with a store barrier over all ranks, so a rank that skipped
the groups it is not in would give its next group a different name from its peers (or wait at
the barrier forever). We therefore loop over every axis and every group of that axis identically on
all ranks and keep only the handles of the groups this rank belongs to.

The result is an ordinary object that callers pass on explicitly (no module-level singleton), so a
process may hold several topologies at once (tests do; so does a chapter comparing orders).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from zero_ref.parallel.topology import Coords, Topology


@dataclass
class ParallelGroups:
    """This rank's process group on every axis of a topology, and its place in the grid."""

    topology: Topology
    rank: int
    coords: Coords
    _groups: dict = field(repr=False)
    _ranks: dict = field(repr=False)

    @property
    def axes(self) -> tuple[str, ...]:
        """The axes whose groups were built."""
        return tuple(self._groups)

    def group(self, axis: str):
        """This rank's ``axis`` process group."""
        if axis not in self._groups:
            raise ValueError(f"ParallelGroups: no {axis!r} group was built; built: {sorted(self._groups)}")
        return self._groups[axis]

    def ranks(self, axis: str) -> list[int]:
        """Global ranks of this rank's ``axis`` group, by coordinate on that axis."""
        self.group(axis)
        return self._ranks[axis]

    def size(self, axis: str) -> int:
        return len(self.ranks(axis))

    def index(self, axis: str) -> int:
        """This rank's position in its ``axis`` group (its tp rank, dp rank, ...)."""
        return self.ranks(axis).index(self.rank)

    tp = property(lambda self: self.group("tp"))
    dp = property(lambda self: self.group("dp"))
    pp = property(lambda self: self.group("pp"))
    ep = property(lambda self: self.group("ep"))
    edp = property(lambda self: self.group("edp"))


def build_groups(topology: Topology, axes: tuple[str, ...] | None = None) -> ParallelGroups:
    """Create the process groups of ``axes`` (default tp, dp, pp, plus ep and edp when ep > 1).

    Collective over the default group: every rank must call it with an equal ``topology``.
    """
    if not dist.is_initialized():
        raise RuntimeError("build_groups: torch.distributed is not initialized (use zero_ref.launch or torchrun)")
    topology.check_world(dist.get_world_size())
    if axes is None:
        axes = ("tp", "dp", "pp") + (("ep", "edp") if topology.ep > 1 else ())
    rank = dist.get_rank()
    groups, ranks = {}, {}
    for axis in axes:
        for members in topology.groups(axis):   # same axes, same groups, same order on every rank
            handle = dist.new_group(members)
            if rank in members:
                groups[axis], ranks[axis] = handle, members
    return ParallelGroups(topology, rank, topology.coords(rank), groups, ranks)
