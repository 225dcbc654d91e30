"""Bytes held over a step, per stage, tier and category: static model states + the tasks' deltas.

The static part is zero_ref.memory's, unchanged: ``model_state_bytes(Ψ, zero_stage, dp, precision,
tp, pp)`` on the GPU (dp: the ranks the states are sharded over, ``Plan.shard_group``: HSDP's dp_shard), or ``offload_placement`` (per pipeline stage and tensor rank: divided by
tp·pp) across GPU / CPU / NVMe, plus ZeRO++ hpZ's secondary shard (2Ψ/g). The dynamic part comes from the task graph: activations of a
micro-batch are allocated when its forward starts and freed when its backward ends, gathered
ZeRO-3 parameters live from their all-gather to the end of the compute that uses them, unreduced
gradient buckets from the backward to their reduction. Sorting every delta by time (frees
before allocations at the same instant: a buffer freed as another is allocated is not held twice)
and taking cumulative sums gives the timeline; its maxima are the peaks.

Not modelled yet: the first and last stages' extra activations (embedding dropout, logits),
pinned host buffers and NVMe staging, the caching allocator's rounding (reserved vs allocated).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zero_ref.memory import model_state_bytes, offload_placement, recipe
from sim.step.zeropp import secondary_bytes
from sim.step.graph import CATEGORIES, TIERS

_STATE = {"params": "param", "grads": "grad", "optimizer": "optim"}


def static_bytes(model, plan) -> dict[str, dict[str, float]]:
    """Model-state bytes one rank holds on each tier, by category (param, grad, optim).

    ``model`` is a sim Model or a parameter count Ψ.
    """
    psi = model if isinstance(model, int) else model.num_params
    out = {t: dict.fromkeys(CATEGORIES, 0.0) for t in TIERS}
    if plan.offload_optimizer == "none" and plan.offload_param == "none":
        states = model_state_bytes(psi, zero_stage=plan.zero_stage, dp=plan.shard_group, precision=plan.precision,
                                   tp=plan.tp, pp=plan.pp)
        out["gpu"].update({_STATE[k]: getattr(states, k) for k in _STATE})
        return _secondary(out, psi, plan)
    tiers = offload_placement(psi, zero_stage=plan.zero_stage, dp=plan.shard_group, precision=plan.precision,
                              offload_optimizer=plan.offload_optimizer, offload_param=plan.offload_param)
    for tier, states in tiers.items():
        out[tier].update({_STATE[k]: getattr(states, k) / (plan.tp * plan.pp) for k in _STATE})
    return _secondary(out, psi, plan)


def _secondary(out: dict, psi: float, plan) -> dict:
    """ZeRO++ hpZ: the secondary 16-bit shard, 2Ψ/g per rank (sim.step.zeropp), on the GPU."""
    if plan.hpz > 1:
        out["gpu"]["param"] += secondary_bytes(plan, psi / (plan.tp * plan.pp), recipe(plan.precision).bytes_per_param("params"))
    return out


@dataclass
class MemoryTimeline:
    """Per stage and tier: event times (seconds; the first row is the static state at time 0) and
    the bytes held by category after each event, ``values[stage][tier]`` shaped (events + 1, categories)."""

    times: list[dict[str, np.ndarray]]
    values: list[dict[str, np.ndarray]]

    @property
    def stages(self) -> int:
        return len(self.times)

    def curve(self, stage: int, tier: str = "gpu") -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(times, {category: bytes, ..., 'total': bytes}) of one stage's tier."""
        v = self.values[stage][tier]
        return self.times[stage][tier], {**{c: v[:, k] for k, c in enumerate(CATEGORIES)}, "total": v.sum(1)}

    def peak(self, stage: int, tier: str = "gpu") -> dict[str, float]:
        """Largest bytes held, per category and in total (the total's peak, not the sum of peaks)."""
        v = self.values[stage][tier]
        peaks = {c: float(v[:, k].max()) for k, c in enumerate(CATEGORIES)}
        return {**peaks, "total": float(v.sum(1).max())}

    def peaks(self, tier: str = "gpu") -> list[dict[str, float]]:
        return [self.peak(s, tier) for s in range(self.stages)]


def memory_timeline(graph, start: np.ndarray, end: np.ndarray, static: dict) -> MemoryTimeline:
    """Apply the graph's memory deltas at their nodes' start/end times on top of ``static``."""
    node = np.asarray(graph.mem_node, dtype=np.int64)
    at_end = np.asarray(graph.mem_at_end, dtype=bool)
    delta = np.asarray(graph.mem_bytes, dtype=np.float64)
    cat = np.asarray(graph.mem_cat, dtype=np.int64)
    tier = np.asarray(graph.mem_tier, dtype=np.int64)
    stage = np.asarray(graph.stage, dtype=np.int64)[node] if len(node) else node
    t = np.where(at_end, end[node], start[node]) if len(node) else np.zeros(0)
    order = np.lexsort((delta > 0, t, tier, stage))  # by stage, tier, time; frees first
    stage, tier, t, cat, delta = stage[order], tier[order], t[order], cat[order], delta[order]
    key = stage * len(TIERS) + tier
    bounds = np.searchsorted(key, np.arange(graph.stages * len(TIERS) + 1))
    times, values = [], []
    for s in range(graph.stages):
        times.append({}), values.append({})
        for k, name in enumerate(TIERS):
            lo, hi = bounds[s * len(TIERS) + k], bounds[s * len(TIERS) + k + 1]
            rows = np.zeros((hi - lo + 1, len(CATEGORIES)))
            rows[0] = [static[name][c] for c in CATEGORIES]
            rows[1 + np.arange(hi - lo), cat[lo:hi]] = delta[lo:hi]
            values[s][name] = np.cumsum(rows, axis=0)
            times[s][name] = np.concatenate(([0.0], t[lo:hi]))
    return MemoryTimeline(times, values)
