"""Context parallelism in the simulator: ring attention and DeepSpeed-Ulysses, per layer on one rank.

    cost = sim.cost.context.context_cost(model, cluster, Plan(tp=8, cp=4, dp=2, cp_kind="ring"))
    cost.activation_bytes, cost.bytes, cost.exposed, cost.link.kind

A cp-way group splits every sequence over cp ranks: each holds s/cp tokens, does 1/cp of every
layer's FLOPs and keeps 1/cp of its activations (its queries against every key: the linear terms
and the score terms both fall as 1/cp). What it costs is traffic inside the group, counted by the
same formulas the real implementations send (``zero_ref.parallel.context``), per layer per rank:

    ring     K/V block of 2·b·(s/cp)·(kv/tp)·d·e bytes, sent cp − 1 times forward, and in backward
             cp − 1 times plus the dK/dV block cp times. Each forward send overlaps one block of
             attention (1/cp of the rank's attention core, timed as ``sim.simulate`` times it: the
             causal FlashAttention kernels with ``attention='flash'``, the full s² as GEMMs otherwise);
             backward sends two blocks per step beside a block of backward attention (twice the
             forward's FLOPs, plus what it recomputes); the last step's
             dK/dV, sent home, has nothing left to hide behind. Exposed per layer:
                 forward   (cp − 1) · max(0, t_send − t_block)
                 backward  (cp − 1) · max(0, 2·t_send − 2·t_block) + t_send
    ulysses  four all-to-alls per pass (Q, K, V in, the output back), each of the rank's whole
             tensor, (cp − 1)/cp of it leaving the rank; nothing overlaps them (DeepSpeed can
             overlap them with the projections on a second stream; not modelled):
                 each      (cp − 1)·α + (cp − 1)/cp · S/B

Ranks are laid out as Megatron does, tp fastest then cp (rank = t + tp·(c + cp·(d + dp·p))), so
the cp group of rank 0 is [0, tp, 2·tp, ...]: on NVLink while tp·cp ≤ GPUs per node, else across
InfiniBand (``sim.spec.topology.group_link``). Constraints: ring needs seq % (2·cp) = 0 (the zig-zag
split); Ulysses needs heads/tp and kv_heads/tp divisible by cp. ``sim.simulate`` schedules the same
traffic inside the step (sim.step.lowering, on the cp_comm stream); tests/sim/test_context.py checks
that the step's exposed time equals ``step_exposed``.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.cost.collectives import point_to_point, reduce_scatter
from sim.cost.cost_model import CostModel, link_terms
from sim.cost.costs import Costs
from sim.cost.flops import CAUSAL, attention_core_flops
from sim.spec.topology import Link, group_link
from zero_ref.memory import activation_bytes_per_layer
from zero_ref.parallel.context import check_ulysses, check_zigzag, ring_bytes, ulysses_bytes


def cp_ranks(plan) -> list[int]:
    """Global ranks of the context-parallel group of rank 0: [0, tp, 2·tp, ..., (cp − 1)·tp]."""
    return [c * plan.tp for c in range(plan.cp)]


def check(model, plan) -> None:
    """The plan's cp must split this model: the zig-zag chunks (ring) or whole heads per rank (Ulysses)."""
    if plan.cp_kind == "ring":
        check_zigzag(model.seq, plan.cp)
        return
    kv = getattr(model, "kv_heads", None) or model.heads
    for name, n in (("heads", model.heads), ("kv_heads", kv)):
        if n % plan.tp:
            raise ValueError(f"Model.{name} = {n} is not divisible by Plan.tp = {plan.tp}")
    check_ulysses(model.heads // plan.tp, plan.cp, kv // plan.tp)


@dataclass(frozen=True)
class ContextCost:
    """One layer of one rank under cp: activation bytes kept, bytes sent and seconds, per pass.

    ``bytes``, ``comm``, ``attention`` and ``exposed`` are {'forward', 'backward'}: bytes this rank
    sends (ring) or hands to all-to-all (Ulysses), seconds of that traffic, seconds of attention-core
    compute it can hide behind, and the seconds left exposed."""

    kind: str
    cp: int
    link: Link
    activation_bytes: float
    bytes: dict
    comm: dict
    attention: dict
    exposed: dict

    def step_exposed(self, layers: int, microbatches: int, recompute: str = "none") -> float:
        """Exposed seconds per step on one rank: ``layers`` layers × ``microbatches`` micro-batches, a
        recomputed forward (recompute 'full') paying its traffic again."""
        forward = self.exposed["forward"] * (2 if recompute == "full" else 1)
        return layers * microbatches * (forward + self.exposed["backward"])


def context_cost(model, cluster, plan, costs: Costs | None = None) -> ContextCost:
    """What ``plan.cp`` and ``plan.cp_kind`` cost one layer of one rank of ``model`` on ``cluster``."""
    check(model, plan)
    cp, tp, b, s = plan.cp, plan.tp, plan.micro_batch_size, model.seq
    width = 4 if plan.precision == "fp32" else 2
    d = model.hidden // model.heads
    kv = getattr(model, "kv_heads", None) or model.heads
    link = group_link(cp_ranks(plan), cluster)
    cm = CostModel(cluster, plan, costs)
    _, alpha, bw = link_terms(link, cm.costs)
    # the attention core this rank computes (its s/cp queries over all s keys, its heads/tp heads),
    # timed as sim.simulate times it (sim.step.lowering, ``core_work``): the backward also redoes the core
    # under selective recomputation and FlashAttention's scores; 'flash' runs only the causal blocks
    # at FlashAttention's efficiency, 'eager' the full s² at the GEMM rate
    core = attention_core_flops(model, b) / (tp * cp)
    rc, flash = plan.recompute, plan.attention == "flash"
    redo = core if rc == "selective" else core / 2 if flash and rc == "none" else 0.0
    rate = cluster.gpu.peak_flops * cm.costs.attention_efficiency / CAUSAL if flash else cm.flops_rate
    attention = {"forward": core / rate, "backward": (2 * core + redo) / rate}
    if plan.cp_kind == "ring":
        sent = ring_bytes(b, s, kv // tp, d, cp, width)
        t_send = point_to_point(sent["forward"] / (cp - 1), alpha, bw) if cp > 1 else 0.0
        block = {k: v / cp for k, v in attention.items()}
        comm = {"forward": (cp - 1) * t_send, "backward": (2 * cp - 1) * t_send}
        exposed = {"forward": (cp - 1) * max(0.0, t_send - block["forward"]),
                   "backward": (cp - 1) * max(0.0, 2 * t_send - block["backward"]) + t_send}
    else:
        sent = ulysses_bytes(b, s, model.heads // tp, d, cp, width, kv_heads=kv // tp)
        one = {"q": model.heads, "k": kv, "v": kv, "out": model.heads}
        t = sum(reduce_scatter(b * (s // cp) * (n // tp) * d * width, cp, alpha, bw) for n in one.values())
        comm = {"forward": t, "backward": t}
        exposed = dict(comm)
    kept = activation_bytes_per_layer(s, b, model.hidden, model.heads, tp=tp, sp=plan.sequence_parallel,
                                      recompute=plan.recompute) / cp
    return ContextCost(plan.cp_kind, cp, link, kept, sent, comm, attention, exposed)
