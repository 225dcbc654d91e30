"""The rank grid: which global ranks form the tensor-, data- and pipeline-parallel groups.

Pure Python (no torch): the simulator, the notebooks and the tests use the same arithmetic as
the real process groups (``zero_ref.parallel.groups`` builds those from a ``Topology``).

A world of ``tp · dp · pp`` ranks is a 3-D grid. ``order`` names the axes from the fastest-varying
to the slowest, as in Megatron-core's ``RankGenerator``; the default ``"tp-dp-pp"`` is Megatron's
``rank = t + tp · (d + dp · p)``. Worked example, 16 ranks on two 8-GPU nodes, tp = 2, dp = 4, pp = 2::

    >>> topo = Topology(tp=2, dp=4, pp=2)
    >>> topo.groups("tp")          # neighbours: one node, NVLink
    [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    >>> topo.groups("dp")
    [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    >>> topo.groups("pp")          # one stage per node: the point-to-point sends cross nodes
    [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]]
    >>> topo.coords(11)
    Coords(t=1, d=1, p=1)
    >>> topo.rank(t=1, d=1, p=1)
    11

Within each group the ranks are listed by their coordinate on that axis, so a rank's index in its
``tp`` group is its tensor-parallel rank. Put the chattiest axis first: tensor parallelism
all-reduces activations in every layer, so its groups must be contiguous ranks (one node);
with ``order="dp-pp-tp"`` the same tp = 2 groups are ``[0, 8], [1, 9], ...`` and every layer's
all-reduce would cross InfiniBand.

Expert parallelism (MoE) is carved out of the data-parallel axis, as in DeepSpeed-MoE and
Megatron-core: with ``ep`` dividing ``dp``, the ``ep`` groups are blocks of ``ep`` consecutive
data-parallel ranks (they exchange tokens with all-to-all) and the ``edp`` groups join the ranks
holding the same experts (they all-reduce expert gradients). ``ep = 1`` (the default) gives one
rank per ``ep`` group.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

GRID_AXES = ("tp", "dp", "pp")
AXES = GRID_AXES + ("ep", "edp")  # ep / edp split the dp axis; they are not grid dimensions
_LETTER = {"tp": "t", "dp": "d", "pp": "p"}


class Coords(NamedTuple):
    """A rank's position on the grid: tensor, data and pipeline coordinate."""

    t: int
    d: int
    p: int


@dataclass(frozen=True)
class Topology:
    """A tp × dp × pp rank grid laid out in ``order`` (fastest-varying axis first)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    order: str = "tp-dp-pp"
    ep: int = 1
    _stride: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("tp", "pp", "dp", "ep"):
            size = getattr(self, name)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"Topology: {name} must be a positive int, got {size!r}")
        axes = tuple(self.order.split("-")) if isinstance(self.order, str) else ()
        if sorted(axes) != sorted(GRID_AXES):
            raise ValueError(f"Topology: order must name each of {GRID_AXES} once, joined by '-' "
                             f"(fastest-varying first, e.g. 'tp-dp-pp'), got {self.order!r}")
        if self.dp % self.ep:
            raise ValueError(f"Topology: ep={self.ep} must divide dp={self.dp} (expert groups split the "
                             f"data-parallel axis)")
        stride, s = {}, 1
        for axis in axes:
            stride[axis] = s
            s *= getattr(self, axis)
        object.__setattr__(self, "_stride", stride)

    @classmethod
    def for_world(cls, world_size: int, *, tp: int = 1, pp: int = 1, order: str = "tp-dp-pp",
                  ep: int = 1) -> "Topology":
        """The grid for ``world_size`` ranks: dp = world_size / (tp · pp)."""
        if world_size < 1 or world_size % (tp * pp):
            raise ValueError(f"Topology: world size {world_size} is not a multiple of tp·pp = {tp}·{pp}")
        return cls(tp=tp, pp=pp, dp=world_size // (tp * pp), order=order, ep=ep)

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def axes(self) -> tuple[str, ...]:
        """The grid axes, fastest-varying first."""
        return tuple(self.order.split("-"))

    def check_world(self, world_size: int) -> None:
        """Raise if ``world_size`` is not tp · dp · pp."""
        if world_size != self.world_size:
            raise ValueError(f"Topology: tp·dp·pp = {self.tp}·{self.dp}·{self.pp} = {self.world_size} "
                             f"ranks, but the world has {world_size}")

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"Topology: rank {rank} outside a world of {self.world_size}")

    def _check_axis(self, axis: str) -> None:
        if axis not in AXES:
            raise ValueError(f"Topology: unknown axis {axis!r}; axes are {AXES}")

    def rank(self, t: int = 0, d: int = 0, p: int = 0) -> int:
        """Global rank of tensor rank t, data rank d, pipeline rank p."""
        for name, c, n in (("t", t, self.tp), ("d", d, self.dp), ("p", p, self.pp)):
            if not 0 <= c < n:
                raise ValueError(f"Topology: coordinate {name}={c} outside 0..{n - 1}")
        return t * self._stride["tp"] + d * self._stride["dp"] + p * self._stride["pp"]

    def coords(self, rank: int) -> Coords:
        """(t, d, p) of a global rank."""
        self._check_rank(rank)
        c = {a: rank // self._stride[a] % getattr(self, a) for a in GRID_AXES}
        return Coords(c["tp"], c["dp"], c["pp"])

    def coord(self, axis: str, rank: int) -> int:
        """A rank's index inside its ``axis`` group."""
        self._check_axis(axis)
        c = self.coords(rank)
        if axis == "ep":
            return c.d % self.ep
        if axis == "edp":
            return c.d // self.ep
        return getattr(c, _LETTER[axis])

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The ranks of the ``axis`` group that contains ``rank``, by coordinate on that axis."""
        self._check_axis(axis)
        t, d, p = self.coords(rank)
        if axis == "tp":
            return [self.rank(i, d, p) for i in range(self.tp)]
        if axis == "pp":
            return [self.rank(t, d, i) for i in range(self.pp)]
        if axis == "dp":
            return [self.rank(t, i, p) for i in range(self.dp)]
        if axis == "ep":  # a block of ep consecutive data-parallel ranks
            start = d - d % self.ep
            return [self.rank(t, start + i, p) for i in range(self.ep)]
        return [self.rank(t, d % self.ep + self.ep * i, p) for i in range(self.dp // self.ep)]  # edp

    def groups(self, axis: str) -> list[list[int]]:
        """Every ``axis`` group, ordered by its smallest rank: they partition the world."""
        self._check_axis(axis)
        seen, out = set(), []
        for r in range(self.world_size):
            if r not in seen:
                g = self.group_of(axis, r)
                seen.update(g)
                out.append(g)
        return out

    def node_of(self, rank: int, gpus_per_node: int) -> int:
        """The node that holds ``rank`` when ranks fill nodes in order (as torchrun assigns them)."""
        self._check_rank(rank)
        return rank // gpus_per_node
