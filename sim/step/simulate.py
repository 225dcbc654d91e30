"""``simulate(model, cluster, plan) -> SimResult``: lower the step, time it, sum it up.

Timing is list scheduling (sim.step.list_schedule) or, with ``engine='events'``, the event
schedule (sim.step.event_schedule), which adds shared links and memory caps.
"""
from __future__ import annotations

import gettext
import math
from dataclasses import dataclass, field
from functools import cached_property
from statistics import fmean  # exactly rounded (fsum): the same on every CPU, unlike numpy's SIMD sums
from typing import NamedTuple

import numpy as np

from sim.cost.cost_model import CostModel
from sim.cost.costs import Costs
from sim.cost.flops import model_flops_per_step
from sim.cost.work import Compute
from sim.spec.hardware import Cluster
from sim.spec.model import Model
from sim.spec.plan import Plan
from sim.step.event_schedule import Contention, event_schedule
from sim.step.graph import KINDS, STREAMS, TaskGraph, node_name
from sim.step.idle import CAUSE_LABELS, CAUSES, idle_by_cause
from sim.step.list_schedule import list_schedule
from sim.step.lowering import build_graph
from sim.step.memory_timeline import MemoryTimeline, memory_timeline, static_bytes


class Event(NamedTuple):
    """One timed task: what, on which stream of which pipeline stage, when (seconds), of what kind."""

    name: str
    stream: str
    stage: int
    start: float
    end: float
    kind: str


@dataclass
class SimResult:
    """One simulated step: times (s), throughput, bubbles, busy time per stream, memory, events.

    ``bubble_fraction``: the compute streams' idle share of the step, averaged over stages.
    ``busy[stream]``: busy seconds per stage. ``memory``: the per-stage timelines; ``peak_memory``
    its GPU peaks per stage by category. ``tflops_per_gpu`` counts model FLOPs (no recompute);
    ``hfu`` counts the FLOPs the GPUs ran (with recompute). ``idle[cause]``: each stage's compute
    idle seconds by cause (sim.step.idle.CAUSES), which add up to step_time − busy['compute'].
    ``engine``: 'list' or 'events' (with ``contention``).
    """

    model: Model
    cluster: Cluster
    plan: Plan
    costs: Costs
    graph: TaskGraph
    start: np.ndarray
    end: np.ndarray
    step_time: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    busy: dict[str, np.ndarray]
    memory: MemoryTimeline
    peak_memory: list[dict[str, float]] = field(default_factory=list)
    engine: str = "list"
    contention: Contention | None = None

    @cached_property
    def idle(self) -> dict[str, np.ndarray]:
        """{cause: idle seconds per stage} of the compute streams (see sim.step.idle)."""
        return idle_by_cause(self.graph, self.start, self.end, self.step_time)

    @property
    def peak_gpu_bytes(self) -> float:
        """The largest GPU total over stages."""
        return max(p["total"] for p in self.peak_memory)

    @property
    def fits(self) -> bool:
        return self.peak_gpu_bytes <= self.cluster.gpu.hbm_bytes

    @property
    def events(self) -> list[Event]:
        g = self.graph
        return [Event(node_name(g, i), STREAMS[g.stream[i]], g.stage[i], float(self.start[i]),
                      float(self.end[i]), KINDS[g.kind[i]]) for i in range(len(g))]

    def idle_line(self) -> str:
        """Idle share of the step by cause, averaged over stages: 'fill/drain 18.2% · p2p 0.4% · ...'."""
        if self.step_time <= 0:
            return _("idle: none")
        share = {c: fmean(v) / self.step_time for c, v in self.idle.items()}
        parts = [f"{_(CAUSE_LABELS[c])} {share[c]:.1%}" for c in CAUSES if share[c] >= 5e-4]
        return _("idle by cause: ") + (", ".join(parts) if parts else _("none"))

    def _cp(self) -> str:
        return f"cp {self.plan.cp} ({self.plan.cp_kind}) " if self.plan.cp > 1 else ""

    def summary(self) -> str:
        """One line of results, and a second with the idle time by cause."""
        gib = 2**30
        line = _("{model} on {world} × {gpu}, tp {tp} {cp}pp {pp} dp {dp}, ZeRO-{zero}{framework}, {schedule} m={m}: "
                 "step {step:.3f} s, {tflops:.1f} TFLOP/s per GPU (MFU {mfu:.1%}), bubble {bubble:.1%}, "
                 "peak {peak:.1f} GiB").format(
            model=self.model.name, world=self.cluster.world_size, gpu=self.cluster.gpu.name, tp=self.plan.tp,
            cp=self._cp(), pp=self.plan.pp, dp=self.plan.dp, zero=self.plan.zero_stage,
            framework='' if self.plan.framework == 'deepspeed' else f' ({self.plan.framework})',
            schedule=self.plan.schedule, m=self.plan.num_microbatches, step=self.step_time,
            tflops=self.tflops_per_gpu, mfu=self.mfu, bubble=self.bubble_fraction, peak=self.peak_gpu_bytes / gib)
        return f"{line}{'' if self.fits else _(' — does not fit')}\n{self.idle_line()}"


def _(message: str) -> str:  # gettext: a Chinese-edition kernel binds the catalog (course/i18n.py)
    return gettext.dgettext("zero_lab", message)


def simulate(model: Model, cluster: Cluster, plan: Plan, costs: Costs | None = None, *,
             granularity="auto", head: bool = True, engine: str = "list",
             contention: Contention | None = None) -> SimResult:
    """Simulate one training step of ``model`` on ``cluster`` under ``plan``.

    ``costs`` overrides the cost model's constants (sim.cost.costs.Costs); ``granularity`` and ``head``
    are passed to sim.step.lowering.build_graph. ``engine``: 'list' (list scheduling, no contention) or
    'events' (sim.step.event_schedule): ``contention`` says what it decides at run time, by default
    ``Contention.for_plan(cluster, plan, costs)`` (DP and pipeline traffic share the NIC when
    both leave the node); ``Contention()`` gives exactly the list schedule.
    """
    for name, value, cls in (("model", model, Model), ("cluster", cluster, Cluster), ("plan", plan, Plan)):
        if not isinstance(value, cls):
            raise TypeError(f"{name} must be a sim.{cls.__name__}, got {type(value).__name__}")
    if plan.world_size != cluster.world_size:
        raise ValueError(f"Plan.tp × cp × pp × dp = {plan.tp} × {plan.cp} × {plan.pp} × {plan.dp} = "
                         f"{plan.world_size} ranks, "
                         f"but the cluster has {cluster.world_size} GPUs")
    if plan.precision.startswith("bf16") and not cluster.gpu.bf16:
        raise ValueError(f"Plan.precision {plan.precision!r}: {cluster.gpu.name} has no bf16; use 'fp16'")
    if engine not in ("list", "events"):
        raise ValueError(f"engine must be 'list' or 'events', got {engine!r}")
    if contention is not None and engine != "events":
        raise ValueError("contention is decided by the event engine: pass engine='events'")
    costs = costs or Costs()
    graph = build_graph(model, plan, granularity=granularity, head=head)
    cm = CostModel(cluster, plan, costs)
    durations = cm.durations(graph.works)
    static = static_bytes(model, plan)
    if engine == "events":
        contention = contention if contention is not None else Contention.for_plan(cluster, plan, costs)
        start, end = event_schedule(graph, durations, contention, static)
    else:
        start, end = list_schedule(graph, durations)
    step = float(end.max()) if len(end) else 0.0

    stage = np.asarray(graph.stage)
    stream = np.asarray(graph.stream)
    dur = end - start
    busy = {name: np.bincount(stage[stream == k], weights=dur[stream == k], minlength=plan.pp)
            for k, name in enumerate(STREAMS)}
    compute = busy["compute"]
    bubble = fmean(1 - compute / step) if step > 0 else 0.0

    model_flops = model_flops_per_step(model, plan.global_batch, head=head)
    tflops = model_flops / (cluster.world_size * step) / 1e12 if step > 0 else 0.0
    flops = np.asarray([w.flops if isinstance(w, Compute) else 0.0 for w in graph.works])[np.asarray(graph.work)]
    hw_flops_per_gpu = math.fsum(flops) / plan.pp  # every stage's rank, averaged
    peak = cluster.gpu.peak_flops
    mem = memory_timeline(graph, start, end, static)
    return SimResult(model, cluster, plan, costs, graph, start, end, step, tflops, tflops * 1e12 / peak,
                     hw_flops_per_gpu / step / peak if step > 0 else 0.0, bubble, busy, mem, mem.peaks("gpu"),
                     engine, contention)
