"""The work a task-graph node holds: what it does, in FLOPs, bytes or parameters, not seconds.

``CostModel.duration`` turns each kind into seconds for one (cluster, plan, costs), so one graph can be
re-timed for other hardware. Frozen, hence hashable: a graph stores each distinct item once.
"""
from __future__ import annotations

from dataclasses import dataclass

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "p2p")
# dp_shard/dp_replica: HSDP's two levels of dp; dp_hpz/dp_hpz_across: ZeRO++'s sub-groups and the ranks across them
AXES = ("tp", "cp", "dp", "pp", "world", "dp_shard", "dp_replica", "dp_hpz", "dp_hpz_across")
LINKS = ("h2d", "d2h", "nvme_read", "nvme_write")


@dataclass(frozen=True)
class Compute:
    """GEMM FLOPs plus the HBM bytes its memory-bound element-wise kernels move, plus FlashAttention's FLOPs."""

    flops: float
    hbm_bytes: float = 0.0
    attention_flops: float = 0.0


@dataclass(frozen=True)
class Collective:
    """``op`` on ``nbytes`` over the ``axis`` group (p2p: to the neighbouring stage or cp rank), ``count`` times back to back."""

    op: str
    nbytes: float
    axis: str
    count: int = 1

    def __post_init__(self):
        if self.op not in COLLECTIVES or self.axis not in AXES:
            raise ValueError(f"Collective op must be one of {COLLECTIVES} and axis one of {AXES}, "
                             f"got {self.op!r} over {self.axis!r}")


@dataclass(frozen=True)
class Copy:
    """``nbytes`` over a host or NVMe ``link``: 'h2d', 'd2h', 'nvme_read' or 'nvme_write'."""

    link: str
    nbytes: float

    def __post_init__(self):
        if self.link not in LINKS:
            raise ValueError(f"Copy link must be one of {LINKS}, got {self.link!r}")


@dataclass(frozen=True)
class Adam:
    """An Adam step on ``params`` parameters, ``on`` the 'gpu' or the 'cpu'."""

    params: float
    on: str = "gpu"

    def __post_init__(self):
        if self.on not in ("gpu", "cpu"):
            raise ValueError(f"Adam runs on 'gpu' or 'cpu', got {self.on!r}")
