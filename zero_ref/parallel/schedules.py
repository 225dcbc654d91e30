"""Pipeline schedules as data: which forward and backward each stage runs, in order (torch-free).

GPipe, 1F1B, interleaved 1F1B and zero-bubble ZB-H1 written as explicit phases (warm-up, steady
state, cool-down) with their counts computed up front. Ops are F (forward), B (backward; in ZB-H1 only
the input gradient) and W (ZB-H1's weight-gradient pass, Qi et al. 2023, arXiv 2401.10241). One home
for both users: the real pipeline on ranks (zero_ref.parallel.pipeline) runs these orders, and the
simulator (sim.pipeline) times them.
"""
from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


def check_schedule(schedule: str, stages: int, microbatches: int, virtual: int = 1) -> None:
    """Raise ValueError if the schedule cannot run p stages × m micro-batches × v chunks.

    GPipe, 1F1B and ZB-H1 run any m ≥ 1 (with m < p most of the step is bubble: (p − 1)/(m + p − 1) ≥ 1/2;
    torch's Schedule1F1B refuses m < p). The interleaved schedule needs m to be a multiple of p, as
    Megatron-LM requires: its forwards go round the p stages in groups of p micro-batches per chunk.
    """
    for name, value in (("stages", stages), ("microbatches", microbatches), ("virtual", virtual)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"pipeline: {name} must be a positive integer, got {value!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"pipeline: schedule must be one of {SCHEDULES}, got {schedule!r}")
    if virtual > 1 and schedule != "interleaved":
        raise ValueError(f"pipeline: virtual={virtual} chunks per stage need schedule='interleaved', got {schedule!r}")
    if schedule == "interleaved" and microbatches % stages:
        raise ValueError(f"pipeline: the interleaved schedule needs the number of micro-batches ({microbatches}) "
                         f"to be a multiple of the number of stages ({stages}) (Megatron-LM's rule: 'number of "
                         f"microbatches is not divisible by pipeline-parallel size when using interleaved schedule')")


def warmup_count(schedule: str, stages: int, microbatches: int, stage: int, virtual: int = 1) -> int:
    """Forwards stage s runs before its first backward: GPipe m; 1F1B and ZB-H1 p − s − 1; interleaved
    2(p − s − 1) + (v − 1)·p (Megatron's count); never more than the v·m forwards it has."""
    p, m, v, s = stages, microbatches, virtual, stage
    if schedule == "gpipe":
        return m
    if schedule in ("1f1b", "zb-h1"):
        return min(p - s - 1, m)
    return min(2 * (p - s - 1) + (v - 1) * p, v * m)


def stage_order(schedule: str, stages: int, microbatches: int, stage: int,
                virtual: int = 1) -> list[tuple[str, int, int]]:
    """The (kind, microbatch, chunk) ops stage s runs, in order, written as three phases.

    GPipe: every forward, then every backward. 1F1B and interleaved: a warm-up of forwards, a
    steady state alternating one forward and one backward, a cool-down of the remaining backwards.
    With v chunks the k-th forward is micro-batch (k // pv)·p + k % p of chunk (k % pv) // p:
    the micro-batches go round in groups of p, chunk after chunk; backwards visit chunks in reverse.
    """
    p, m, v = stages, microbatches, virtual
    check_schedule(schedule, p, m, v)
    if not 0 <= stage < p:
        raise ValueError(f"pipeline: stage must be in [0, {p}), got {stage}")
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in reversed(range(m))]
    if schedule == "zb-h1":
        return zb_h1_order(p, m, stage)

    def fwd(k):
        return "F", (k // (p * v)) * p + k % p, (k % (p * v)) // p

    def bwd(k):
        return "B", (k // (p * v)) * p + k % p, v - 1 - (k % (p * v)) // p

    total, warmup = v * m, warmup_count(schedule, p, m, stage, v)   # counts computed up front
    ops = [fwd(k) for k in range(warmup)]                               # warm-up
    for k in range(total - warmup):                                     # steady state: 1F1B
        ops += [fwd(warmup + k), bwd(k)]
    return ops + [bwd(k) for k in range(total - warmup, total)]        # cool-down


def deferred_w(stages: int, microbatches: int, stage: int) -> int:
    """ZB-H1's weight-gradient passes stage s holds back to the end of the step: s (at most m).

    In 1F1B stage s idles s·t_b at the end of the step while the last gradients travel back to
    stage 0; ZB-H1 runs its last s W passes there (torch 2.13's ScheduleInterleavedZeroBubble:
    ``num_1f1b_microbatches = rank``)."""
    return min(stage, microbatches)


def zb_h1_order(stages: int, microbatches: int, stage: int) -> list[tuple[str, int, int]]:
    """ZB-H1's ops on stage s: 1F1B's phases with each backward split into B (input gradient) and W.

    Warm-up p − s − 1 forwards; steady state F, B, and from the (s + 1)-th backward on a W after
    each B (the oldest micro-batch whose W is due); cool-down B (+ W) for the remaining backwards;
    then the s deferred W. A micro-batch's activations live from its F to its W: at most p at once,
    1F1B's peak on stage 0 (torch.distributed.pipelining's _get_1f1b_rank_ops with
    enable_zero_bubble=True builds the same order)."""
    p, m, s = stages, microbatches, stage
    warmup, defer = warmup_count("zb-h1", p, m, s), deferred_w(p, m, s)
    ops, w_next = [("F", i, 0) for i in range(warmup)], 0                # warm-up

    def backward(k):
        nonlocal w_next
        ops.append(("B", k, 0))
        if k >= defer:                                                     # W runs s backwards late
            ops.append(("W", w_next, 0))
            w_next += 1

    for k in range(m - warmup):                                            # steady state: F, B (, W)
        ops.append(("F", warmup + k, 0))
        backward(k)
    for k in range(m - warmup, m):                                         # cool-down: B (, W)
        backward(k)
    return ops + [("W", i, 0) for i in range(w_next, m)]                  # the deferred W
