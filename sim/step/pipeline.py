"""Pipeline bubbles: closed forms, and the schedule timeline they come from.

With p stages, m micro-batches, forward time t_f and backward time t_b per micro-batch per stage
(uniform stages, free communication), GPipe and 1F1B both finish in (m + p − 1)(t_f + t_b): each
stage idles (p − 1)(t_f + t_b) of that, so

    bubble fraction (idle share of the step)    = (p − 1) / (m + p − 1)
    bubble overhead (idle relative to the work) = (p − 1) / m      (Megatron-LM's "bubble time fraction")

Interleaving v model chunks per stage divides the idle time by v: (p − 1) / (v·m + p − 1), where
each chunk's forward/backward takes t_f/v, t_b/v.

ZB-H1 (Qi et al. 2023) splits the backward into B (input gradient, t_b) and W (weight gradient, t_w),
1F1B's backward being t_b + t_w. Deferred W passes fill the cool-down: each stage idles
(p − 1)(t_f + t_b − t_w) instead of (p − 1)(t_f + t_b + t_w) (``zb_h1_bubble``).

The orders are written as explicit phases with counts computed up front (``warmup_count``,
``stage_order``: warm-up, steady 1F1B, cool-down); ``schedule_order`` merges the stages' orders
into one topological order, which the simulator's task graph (sim.step.lowering) is built in.
"""
from __future__ import annotations

from dataclasses import dataclass

# The orders live in zero_ref.parallel.schedules (torch-free), which the real pipeline runs too.
from zero_ref.parallel.schedules import stage_order


def _check(p: int, m: int, v: int = 1) -> None:
    for name, value in (("stages", p), ("microbatches", m), ("virtual", v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    """Share of a step each stage sits idle: (p − 1) / (v·m + p − 1)."""
    _check(stages, microbatches, virtual)
    return (stages - 1) / (virtual * microbatches + stages - 1)


def bubble_overhead(stages: int, microbatches: int, virtual: int = 1) -> float:
    """Idle time over useful compute time: (p − 1) / (v·m)."""
    _check(stages, microbatches, virtual)
    return (stages - 1) / (virtual * microbatches)


def zb_h1_bubble(stages: int, microbatches: int, t_f: float, t_b: float, t_w: float) -> float:
    """ZB-H1's idle share of the step: idle / (m(t_f + t_b + t_w) + idle), idle = (p − 1)(t_f + t_b − t_w).

    Qi et al.'s closed form, exact on the free-communication timeline when m ≥ p and t_w ≤ t_f ≤ t_b
    (a W then always fits in the gap it fills; tests/sim/test_pipeline.py checks where it holds).
    Outside those conditions it is a ValueError: ``pipeline_timeline(..., 'zb-h1', t_w=...)`` times any case."""
    _check(stages, microbatches)
    for name, t in (("t_f", t_f), ("t_b", t_b), ("t_w", t_w)):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            raise ValueError(f"{name} must be a non-negative number of seconds, got {t!r}")
    if microbatches < stages or not t_w <= t_f <= t_b:
        raise ValueError(f"ZB-H1's closed form needs m ≥ p and t_w ≤ t_f ≤ t_b, got p={stages}, m={microbatches}, "
                         f"t_f={t_f:.3g}, t_b={t_b:.3g}, t_w={t_w:.3g}; time this case with "
                         "sim.pipeline_timeline(p, m, 'zb-h1', t_f, t_b, t_w=t_w)")
    idle = (stages - 1) * (t_f + t_b - t_w)
    return idle / (microbatches * (t_f + t_b + t_w) + idle)


@dataclass(frozen=True)
class Slot:
    """One op on one stage: ``kind`` 'F', 'B' or 'W' of ``microbatch`` (model ``chunk``), ``start`` to ``end``."""

    stage: int
    kind: str
    microbatch: int
    start: float
    end: float
    chunk: int = 0


def dependency(kind: str, stage: int, microbatch: int, chunk: int, stages: int, virtual: int):
    """The op that must finish before this one, as (kind, stage, microbatch, chunk), or None.

    Virtual stage c·p + s holds chunk c of stage s. F needs the previous virtual stage's F; B needs
    the next virtual stage's B; the last virtual stage's B needs its own F; W needs its own B.
    """
    p, last = stages, stages * virtual - 1
    vs = chunk * p + stage
    if kind == "W":
        return ("B", stage, microbatch, chunk)
    if kind == "F":
        return None if vs == 0 else ("F", (vs - 1) % p, microbatch, (vs - 1) // p)
    if vs == last:
        return ("F", stage, microbatch, chunk)
    return ("B", (vs + 1) % p, microbatch, (vs + 1) // p)


def schedule_order(schedule: str, stages: int, microbatches: int,
                   virtual: int = 1) -> list[tuple[int, str, int, int]]:
    """Every (stage, kind, microbatch, chunk) op of a step in one topological order.

    Each stage keeps its ``stage_order``; a stage's next op is taken once its dependency has been
    taken (a unit-time dry run, round robin over stages). Raises if the orders deadlock.
    """
    p, m, v = stages, microbatches, virtual
    orders = [stage_order(schedule, p, m, s, v) for s in range(p)]
    taken: set = set()
    cursor = [0] * p
    out: list[tuple[int, str, int, int]] = []
    total = sum(len(o) for o in orders)
    while len(out) < total:
        progressed = False
        for s in range(p):
            while cursor[s] < len(orders[s]):
                kind, i, c = orders[s][cursor[s]]
                dep = dependency(kind, s, i, c, p, v)
                if dep is not None and dep not in taken:
                    break
                taken.add((kind, s, i, c))
                out.append((s, kind, i, c))
                cursor[s] += 1
                progressed = True
        if not progressed:  # cannot happen for these schedules; guards against a wrong order
            raise RuntimeError("pipeline schedule deadlocked")
    return out


def pipeline_timeline(stages: int, microbatches: int, schedule: str = "1f1b",
                      t_f: float = 1.0, t_b: float = 2.0, virtual: int = 1, t_w: float = 0.0) -> list[Slot]:
    """Start and end of every forward/backward on every stage, by list scheduling.

    Each op starts when its stage is free and its input is ready: F(s, i) needs F(s−1, i);
    B(s, i) needs B(s+1, i) (and F(s, i)); with ``virtual`` chunks the neighbours are virtual
    stages. ``t_f``/``t_b`` are per op (per chunk when interleaved). Communication is free.
    ``t_w``: the weight-gradient share of the backward. ZB-H1 runs it as its own op W (B takes
    t_b); the other schedules inside the backward (B takes t_b + t_w), so one (t_f, t_b, t_w)
    compares them on the same work.
    """
    t_full = t_b + t_w if schedule != "zb-h1" else t_b
    durations = {"F": t_f, "B": t_full, "W": t_w}
    done: dict[tuple[str, int, int, int], float] = {}
    free = [0.0] * stages
    slots: list[Slot] = []
    for s, kind, i, c in schedule_order(schedule, stages, microbatches, virtual):
        dep = dependency(kind, s, i, c, stages, virtual)
        start = max(free[s], done[dep] if dep else 0.0)
        end = start + durations[kind]
        done[(kind, s, i, c)] = free[s] = end
        slots.append(Slot(s, kind, i, start, end, c))
    return slots
