"""Bytes one rank sends per step, read off a step's task graph (ring algorithms, as NCCL's large messages run).

A collective of S bytes (the full, unsharded buffer) over n ranks sends 2(n−1)/n·S per rank as an
all-reduce and (n−1)/n·S as a reduce-scatter or all-gather — zero_ref.comm.ring_wire_bytes's
count, which chapters 3–5 measure on real ranks. ``sim.step.frameworks`` lists each framework's
volumes; ``zero_ref.volume`` has them in closed form.
"""
from __future__ import annotations

from sim.cost.cost_model import CostModel
from sim.cost.work import Collective
from sim.step.graph import KINDS

DATA_PARALLEL = ("dp", "dp_shard", "dp_replica", "dp_hpz", "dp_hpz_across")
_FACTOR = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "all_to_all": 1}  # all-to-all: keeps 1/n


def group_size(plan, axis: str) -> int:
    """Ranks in a plan's ``axis`` group (the dp group: the dp·cp ranks holding the same parameters)."""
    return {"dp": plan.dp * plan.cp, "dp_shard": plan.shard_group, "dp_replica": plan.replicas, "tp": plan.tp,
            "dp_hpz": plan.hpz, "dp_hpz_across": plan.dp * plan.cp // plan.hpz,
            "cp": plan.cp, "pp": 2, "world": plan.world_size}[axis]


def wire_bytes(work: Collective, plan) -> float:
    """Bytes one rank sends for ``work`` (count times back to back)."""
    if work.op == "p2p":
        return work.count * work.nbytes
    n = group_size(plan, work.axis)
    return work.count * _FACTOR[work.op] * (n - 1) / n * work.nbytes


def bytes_sent(graph, plan, axes=DATA_PARALLEL, stage: int = 0) -> dict[str, float]:
    """{node kind: bytes} one rank of pipeline ``stage`` sends per step over the ``axes`` groups
    (the gradient-norm scalar all-reduce excluded)."""
    out: dict[str, float] = {}
    for i in range(len(graph)):
        work = graph.works[graph.work[i]]
        kind = KINDS[graph.kind[i]]
        if graph.stage[i] == stage and isinstance(work, Collective) and work.axis in axes:
            out[kind] = out.get(kind, 0.0) + wire_bytes(work, plan)
    return out


def bytes_by_link(graph, plan, cluster, axes=DATA_PARALLEL, stage: int = 0) -> dict[str, float]:
    """{'nvlink' | 'ib': bytes} one rank of pipeline ``stage`` sends per step over the ``axes`` groups, each
    group's collectives on its link (sim.spec.topology.group_link: inside a node or across nodes)."""
    links = CostModel(cluster, plan).links
    out: dict[str, float] = {}
    for i in range(len(graph)):
        work = graph.works[graph.work[i]]
        if graph.stage[i] == stage and isinstance(work, Collective) and work.axis in axes:
            kind = links[work.axis].kind
            out[kind] = out.get(kind, 0.0) + wire_bytes(work, plan)
    return out
