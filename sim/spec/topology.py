"""Where ranks sit: the tp × dp × pp rank grid and which link a process group's collectives use.

The grid is ``zero_ref.parallel.topology.Topology``; its default order is Megatron's, tensor-parallel
fastest: rank = t + tp·(d + dp·p). With 8 GPUs per node and
tp = 8, dp = 2, pp = 2 the groups of rank 0 are

    tp: [0, 1, ..., 7]      (one node: NVLink)
    dp: [0, 8]              (two nodes, one GPU each: InfiniBand)
    pp: [0, 16]

A group inside one node talks over NVLink. A group spanning nodes is limited by InfiniBand: each
of its GPUs drives its own NIC share (ib_bw / gpus_per_node), so a ring with g members per node
moves g such shares across each node boundary (NCCL runs one ring per NIC): the bandwidth is
g · ib_bw_per_gpu, never more than NVLink. With one member per node that is the IB bandwidth per GPU.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from zero_ref.parallel.topology import Topology  # the rank-grid math lives once, torch-free, in zero_ref

AXES = ("tp", "dp", "pp")


def rank_of(t: int, d: int, p: int, tp: int, dp: int) -> int:
    """Global rank of tensor rank t, data rank d, pipeline rank p in the default order.

    pp is the slowest axis there, so the rank does not depend on it: p + 1 stages stand in.
    """
    return Topology(tp=tp, dp=dp, pp=p + 1).rank(t=t, d=d, p=p)


def group_ranks(axis: str, tp: int, dp: int, pp: int, *, t: int = 0, d: int = 0, p: int = 0,
                order: str = "tp-dp-pp", shard: int = 0) -> list[int]:
    """The ranks of the ``axis`` group that contains (t, d, p); ``order`` as in ``zero_ref.parallel.topology``.

    HSDP's axes split the dp group: 'dp_shard', ``shard`` consecutive dp ranks (0: all of dp), and
    'dp_replica', the ranks at the same place of every shard group. ZeRO++'s 'dp_hpz' and 'dp_hpz_across'
    split it the same way with ``shard`` the hpZ sub-group size.
    """
    if axis == "world":
        return list(range(tp * dp * pp))
    if axis in ("dp_shard", "dp_replica", "dp_hpz", "dp_hpz_across"):
        ranks, shard = group_ranks("dp", tp, dp, pp, t=t, d=d, p=p, order=order), shard or dp
        first = d - d % shard
        return ranks[first:first + shard] if axis in ("dp_shard", "dp_hpz") else ranks[d % shard::shard]
    if axis not in AXES:
        raise ValueError(f"axis must be one of {AXES + ('world',)}, got {axis!r}")
    topo = Topology(tp=tp, dp=dp, pp=pp, order=order)
    return topo.group_of(axis, topo.rank(t=t, d=d, p=p))


@dataclass(frozen=True)
class Link:
    """The link a group's traffic crosses: 'nvlink' or 'ib', its raw bandwidth (bytes/s), group size."""

    kind: str
    bandwidth: float
    size: int
    per_node: int  # most members of the group on one node


def group_link(ranks: list[int], cluster) -> Link:
    """NVLink when every rank is on one node, else InfiniBand at per_node × IB-per-GPU (≤ NVLink)."""
    nodes = Counter(r // cluster.gpus_per_node for r in ranks)
    per_node = max(nodes.values())
    if len(nodes) == 1:
        return Link("nvlink", cluster.nvlink_bw, len(ranks), per_node)
    return Link("ib", min(cluster.nvlink_bw, per_node * cluster.ib_bw_per_gpu), len(ranks), per_node)


def p2p_link(tp: int, dp: int, cluster) -> Link:
    """The link between adjacent pipeline stages (ranks tp·dp apart)."""
    return group_link([0, tp * dp], cluster)
