"""Pipeline bubbles: closed forms, and the schedule timeline they come from.

With p stages, m micro-batches, forward time t_f and backward time t_b per micro-batch per stage
(uniform stages, free communication), GPipe and 1F1B both finish in (m + p − 1)(t_f + t_b): each
stage idles (p − 1)(t_f + t_b) of that, so

    bubble fraction (idle share of the step)    = (p − 1) / (m + p − 1)
    bubble overhead (idle relative to the work) = (p − 1) / m      (Megatron-LM's "bubble time fraction")

Interleaving v model chunks per stage divides the idle time by v: (p − 1) / (v·m + p − 1).
"""
from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class Slot:
    """One unit of work on one stage: ``kind`` 'F' or 'B' of ``microbatch`` from ``start`` to ``end``."""

    stage: int
    kind: str
    microbatch: int
    start: float
    end: float


def _order(schedule: str, p: int, m: int, stage: int) -> list[tuple[str, int]]:
    """The order in which one stage runs its forwards and backwards."""
    if schedule == "gpipe":  # all forwards, then all backwards
        return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]
    # 1F1B: warm-up forwards, then alternate one forward / one backward, then cool-down backwards.
    warmup = min(p - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(m - warmup, m)]
    return order


def pipeline_timeline(stages: int, microbatches: int, schedule: str = "1f1b",
                      t_f: float = 1.0, t_b: float = 2.0) -> list[Slot]:
    """Start and end of every forward/backward on every stage, by list scheduling.

    Each op starts when its stage is free and its input is ready: F(s, i) needs F(s−1, i);
    B(s, i) needs B(s+1, i) (and F(s, i)). Communication is free.
    """
    _check(stages, microbatches)
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
    p, m = stages, microbatches
    orders = [_order(schedule, p, m, s) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    cursor, free = [0] * p, [0.0] * p
    slots: list[Slot] = []
    while len(slots) < 2 * p * m:
        progressed = False
        for s in range(p):
            if cursor[s] == len(orders[s]):
                continue
            kind, i = orders[s][cursor[s]]
            if kind == "F":  # the first stage has its input; others wait for the previous stage
                dep = ("F", s - 1, i) if s > 0 else None
            else:  # the last stage's backward follows its own forward; others wait for the next stage
                dep = ("B", s + 1, i) if s < p - 1 else ("F", s, i)
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done[dep] if dep else 0.0)
            end = start + (t_f if kind == "F" else t_b)
            done[(kind, s, i)] = free[s] = end
            slots.append(Slot(s, kind, i, start, end))
            cursor[s] += 1
            progressed = True
        if not progressed:  # cannot happen for these schedules; guards against a wrong order
            raise RuntimeError("pipeline schedule deadlocked")
    return slots
