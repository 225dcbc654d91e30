"""Profile real zero_ref training steps on gloo ranks: the measurements the simulator is calibrated on.

    from zero_ref.profiling import profile
    specs = {"zero1": profile.StepSpec(stage=1, micro_batch=4), "zero2 mb8": profile.StepSpec(2, 8)}
    m = profile.measure(specs, world_size=2)   # plain numbers (dicts, lists, floats): sim.fit_local reads them
    m["steps"]["zero1"]["cpu"]["step"]          # CPU seconds of one optimizer step (its process, all threads)
    m["steps"]["zero1"]["wall"]["step"]         # wall seconds of the fastest step
    m["sweep"]                                  # [{"op", "bytes", "group_size", "seconds"}, ...]
    m["machine"]                                # per rank: GEMM FLOP/s, memory bytes/s, cores

What each rank measures (all ranks at once, so they share the machine as they do in training):

- machine: the FLOP/s of a matmul at the model's MLP shape, and the bytes/s of an element-wise add
  over 16 MiB arrays, each the best of repeated calls: what a "GPU" is for a CPU rank
  (``sim.fit_local.host_cluster``).
- sweep: each collective in ``SWEEP_OPS`` at each size, after a barrier, ``trials`` times with the
  sizes and ops interleaved; the *fastest* call. Other work on the machine only ever adds time to a
  call (a rank descheduled mid-collective stalls its peer too), so the minimum is the estimate of
  what the link costs that is reproducible on a loaded machine; the median of a 4 KiB call moved
  by 10× between runs at load 10 on 2 cores, its minimum by 1.3×.
- steps: the specs' steps interleaved in the same processes (the order alternates every round), so
  load from other work hits every spec alike. After ``warmup`` rounds, ``steps`` rounds, each step
  timed on two clocks, for the step, its phases (forward, backward, optimizer; one step = ``gas``
  micro-steps) and every collective it calls (``timed_comm`` wraps each call through
  ``zero_ref.comm``; a call with ``async_op``, ZeRO-3's prefetch, is listed but its time is that of
  the launch: its wait falls inside the phase that needs the result):

  ``cpu``   the CPU time the rank's process spends (every thread: gloo does a collective's copies
            and sums on its own), from the step of median CPU time. It is the step's work — about
            what the step takes when the machine is not shared — and it barely moves with load
            (ZeRO-1 on the course GPT: 97–107 ms per step at load 14 on 2 cores, where the wall
            clock read 550–780 ms; benchmarks/README's lightly loaded wall clock for the same step
            is 110.7 ms).
  ``wall``  wall-clock seconds of the *fastest* step (``wall_median``: the median), which on a
            shared machine measures the scheduler as much as the step.
  ``cpu_steps``  the CPU time of every measured step, in order (the spread of ``cpu``).

  Each view's numbers come from one step, so its phases and calls add up to its step.

The stages run with ``overlap_comm=False``: on a CPU rank a collective runs on the same cores as
the compute (measured: overlapping does not shorten the step), and synchronous calls make the
phases separable. The ranks' numbers are combined by their mean.
"""
from __future__ import annotations

import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from zero_ref import comm
from zero_ref.launcher import launch
from zero_ref.models import GPT, Block, GPTConfig, make_batch
from zero_ref.optim import AdamConfig
from zero_ref.stages import STAGES

# The course GPT (benchmarks/zero_stages.py): 4 blocks, d 256, vocab 1024, seq 64, 3.44M parameters.
COURSE_GPT = dict(vocab_size=1024, seq_len=64, d_model=256, n_heads=4, n_layers=4)
SWEEP_OPS = ("all_reduce", "reduce_scatter", "all_gather")
KiB, MiB = 1 << 10, 1 << 20
SWEEP_BYTES = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB)  # full buffer
_TIMED = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")


@dataclass(frozen=True)
class StepSpec:
    """One training configuration of ``zero_ref.stages.STAGES[stage]``: ``micro_batch`` sequences per
    micro-step, ``gas`` micro-steps per optimizer step (ZeRO-3 shards per transformer block)."""

    stage: int
    micro_batch: int
    gas: int = 1

    def __post_init__(self):
        if self.stage not in (0, 1, 2, 3) or isinstance(self.stage, bool):
            raise ValueError(f"StepSpec.stage must be 0, 1, 2 or 3, got {self.stage!r}")
        for name in ("micro_batch", "gas"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"StepSpec.{name} must be a positive integer, got {v!r}")


# ---------------------------------------------------------------- machine


def _best_time(fn, min_seconds: float = 0.05, max_reps: int = 200) -> float:
    """Fewest seconds of ``fn()`` over repeated calls lasting at least ``min_seconds`` (after one warm-up)."""
    fn()
    times, start = [], time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < min_seconds and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def gemm_flops(m: int, k: int, n: int) -> float:
    """FLOP/s of an (m × k) @ (k × n) fp32 matmul on this process's threads: 2mkn / seconds."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.empty(m, n)
    return 2 * m * k * n / _best_time(lambda: torch.mm(a, b, out=out))


def memory_bandwidth(nbytes: int = 16 << 20) -> float:
    """Bytes/s of ``c = a + b`` over fp32 arrays of ``nbytes`` each (reads 2, writes 1)."""
    n = nbytes // 4
    a, b, c = torch.ones(n), torch.ones(n), torch.empty(n)
    return 3 * nbytes / _best_time(lambda: torch.add(a, b, out=c))


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def memory_bytes() -> int:
    """Physical memory of the host (bytes)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ---------------------------------------------------------------- collectives


def _call(op: str, full: torch.Tensor, shard: torch.Tensor, group=None) -> None:
    if op == "all_reduce":
        comm.all_reduce(full, group=group)
    elif op == "reduce_scatter":
        comm.reduce_scatter(shard, full, group=group)
    elif op == "all_gather":
        comm.all_gather(full, shard, group=group)
    else:
        raise ValueError(f"op must be one of {', '.join(SWEEP_OPS)}, got {op!r}")


def collective_sweep(sizes=SWEEP_BYTES, ops=SWEEP_OPS, *, trials: int = 15, group=None) -> list[dict]:
    """Seconds of the fastest of ``trials`` calls of each collective at each full-buffer size (bytes,
    fp32), on every rank of ``group`` (call it on all of them): [{"op", "bytes", "group_size", "seconds"}]."""
    n = dist.get_world_size(group)
    bufs = {}
    for size in sizes:
        numel = max(n, size // 4 // n * n)  # a whole number of fp32 elements per rank
        bufs[size] = (torch.ones(numel), torch.ones(numel // n))
    times: dict[tuple, list[float]] = {}
    for trial in range(trials + 1):  # trial 0 warms up every buffer and connection
        for op in ops:
            for size in sizes:
                full, shard = bufs[size]
                dist.barrier(group=group)
                t0 = time.perf_counter()
                _call(op, full, shard, group)
                if trial:
                    times.setdefault((op, size), []).append(time.perf_counter() - t0)
    return [{"op": op, "bytes": bufs[size][0].numel() * 4, "group_size": n,
             "seconds": min(times[(op, size)])} for op in ops for size in sizes]


def _clocks() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process: every thread, gloo's workers included)."""
    return time.perf_counter(), time.process_time()


@contextmanager
def timed_comm(phase: dict):
    """Time every collective called through ``zero_ref.comm`` inside the block. Yields a list that
    receives {"op", "bytes", "group_size", "phase", "async", "seconds", "cpu_seconds"} per call;
    ``phase["name"]`` (set by the caller as it goes) labels each call."""
    calls, originals = [], {name: getattr(comm, name) for name in _TIMED}

    def timed(fn):
        def wrapper(*args, **kwargs):
            with comm.recording() as log:
                w0, c0 = _clocks()
                out = fn(*args, **kwargs)
                w1, c1 = _clocks()
            rec = log.records[-1]
            calls.append({"op": rec.op, "bytes": rec.bytes, "group_size": rec.group_size,
                          "phase": phase.get("name", ""), "async": bool(kwargs.get("async_op", False)),
                          "seconds": w1 - w0, "cpu_seconds": c1 - c0})
            return out
        return wrapper

    try:
        for name, fn in originals.items():
            setattr(comm, name, timed(fn))
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(comm, name, fn)


# ---------------------------------------------------------------- training steps


def _build(spec: StepSpec, cfg):
    torch.manual_seed(0)
    model = GPT(cfg)
    extra = {"unit_modules": (Block,)} if spec.stage == 3 else {}
    opt = STAGES[spec.stage](model, adam=AdamConfig(lr=1e-3, weight_decay=0.0), overlap_comm=False,
                             gradient_accumulation_steps=spec.gas, **extra)
    return model, opt


def _one_step(model, opt, batches, phase: dict) -> dict:
    """One optimizer step (``len(batches)`` micro-steps): {"wall": {...}, "cpu": {...}}, each with the
    seconds of the step and of its phases (forward, backward, optimizer) summed over micro-steps."""
    out = {clock: dict.fromkeys(("forward", "backward", "optimizer"), 0.0) for clock in ("wall", "cpu")}
    start = _clocks()
    for idx, targets in batches:
        t = [_clocks()]
        phase["name"] = "forward"
        _, loss = model(idx, targets)
        t.append(_clocks())
        phase["name"] = "backward"
        opt.backward(loss)
        t.append(_clocks())
        phase["name"] = "optimizer"
        opt.step()
        t.append(_clocks())
        for k, name in enumerate(("forward", "backward", "optimizer")):
            for c, clock in enumerate(("wall", "cpu")):
                out[clock][name] += t[k + 1][c] - t[k][c]
    end = _clocks()
    for c, clock in enumerate(("wall", "cpu")):
        out[clock]["step"] = end[c] - start[c]
    return out


def _view(row: dict, clock: str) -> dict:
    """One step's numbers on one clock: step, phases, collective seconds by phase, the calls."""
    key = "seconds" if clock == "wall" else "cpu_seconds"
    calls = [{**{k: v for k, v in c.items() if k not in ("seconds", "cpu_seconds")}, "seconds": c[key]}
             for c in row["calls"]]
    comm_by_phase = {p: sum(c["seconds"] for c in calls if c["phase"] == p and not c["async"])
                     for p in ("forward", "backward", "optimizer")}
    return {**row[clock], "comm": comm_by_phase, "collectives": calls}


def _measure_rank(rank, world, specs, model, steps, warmup, sweep_sizes, sweep_trials, seed):
    cfg = GPTConfig(**model)
    specs = {name: StepSpec(**s) for name, s in specs.items()}
    m0 = min(s.micro_batch for s in specs.values()) if specs else 4
    gemm = (m0 * cfg.seq_len, cfg.d_model, cfg.ffn_mult * cfg.d_model)
    machine = {"gemm_flops": gemm_flops(*gemm),
               "memory_bw": memory_bandwidth(), "cores": cores(), "world_size": world, "memory_bytes": memory_bytes(),
               "threads": torch.get_num_threads()}
    sweep = collective_sweep(sweep_sizes, trials=sweep_trials) if sweep_sizes else []
    runs = {name: _build(spec, cfg) for name, spec in specs.items()}
    batches = {name: [make_batch(cfg, s.micro_batch, seed=seed + 1000 * rank + m) for m in range(s.gas)]
               for name, s in specs.items()}
    rows: dict[str, list[dict]] = {name: [] for name in specs}
    phase: dict = {}
    names = list(specs)
    for r in range(warmup + steps):
        for name in (names if r % 2 else names[::-1]):
            model_, opt = runs[name]
            dist.barrier()
            with timed_comm(phase) as calls:
                row = _one_step(model_, opt, batches[name], phase)
            row["calls"] = calls
            if r >= warmup:
                rows[name].append(row)
    # the peak: the better of two timings, before and after the steps (another tenant seldom slows both)
    machine["gemm_flops"] = max(machine["gemm_flops"], gemm_flops(*gemm))
    out = {}
    for name, spec in specs.items():
        rs = rows[name]
        fastest = min(rs, key=lambda row: row["wall"]["step"])
        median = sorted(rs, key=lambda row: row["cpu"]["step"])[len(rs) // 2]
        out[name] = {**asdict(spec), "world_size": world, "seq_len": cfg.seq_len, "steps": len(rs),
                     "wall": _view(fastest, "wall"), "cpu": _view(median, "cpu"),
                     "wall_median": statistics.median(row["wall"]["step"] for row in rs),
                     "cpu_steps": [row["cpu"]["step"] for row in rs]}  # every measured step: the run-to-run spread
    return {"machine": machine, "sweep": sweep, "steps": out}


def _mean(values):
    return sum(values) / len(values)


def measure(specs: dict, world_size: int, *, model: dict | None = None, steps: int = 6, warmup: int = 2,
            sweep_sizes=SWEEP_BYTES, sweep_trials: int = 15, seed: int = 0, timeout: float = 300.0) -> dict:
    """Run ``specs`` ({name: StepSpec}) on ``world_size`` gloo ranks (one thread each) and return
    {"model": GPTConfig fields, "machine": {...}, "sweep": [...], "steps": {name: {...}}} (see the
    module docstring): each number the mean over ranks of the rank's fastest step (sweep: fastest call).
    ``sweep_sizes`` empty skips the sweep; ``model`` overrides GPTConfig fields of ``COURSE_GPT``."""
    if not isinstance(specs, dict) or not all(isinstance(s, StepSpec) for s in specs.values()):
        raise TypeError("specs must be a dict {name: StepSpec}")
    for name, v, least in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {v!r}")
    model = {**COURSE_GPT, **(model or {})}
    ranks = launch(_measure_rank, world_size, {k: asdict(s) for k, s in specs.items()}, model, steps, warmup,
                   tuple(sweep_sizes or ()), sweep_trials, seed, timeout=timeout, echo=False)
    machine = {k: (_mean([r["machine"][k] for r in ranks]) if isinstance(ranks[0]["machine"][k], float)
                   else ranks[0]["machine"][k]) for k in ranks[0]["machine"]}
    sweep = [dict(row, seconds=_mean([r["sweep"][i]["seconds"] for r in ranks])) for i, row in enumerate(ranks[0]["sweep"])]
    steps_out = {}
    for name, row in ranks[0]["steps"].items():
        per = [r["steps"][name] for r in ranks]
        merged = {**row, "wall_median": _mean([p["wall_median"] for p in per]),
                  "cpu_steps": [_mean(step) for step in zip(*(p["cpu_steps"] for p in per))]}
        for clock in ("wall", "cpu"):
            view = dict(row[clock])
            for k in ("step", "forward", "backward", "optimizer"):
                view[k] = _mean([p[clock][k] for p in per])
            view["comm"] = {ph: _mean([p[clock]["comm"][ph] for p in per]) for ph in view["comm"]}
            # ranks whose chosen step issued the same calls as rank 0's (a step can carry a one-time call)
            alike = [p for p in per if [c["op"] for c in p[clock]["collectives"]] == [c["op"] for c in view["collectives"]]]
            view["collectives"] = [dict(c, seconds=_mean([p[clock]["collectives"][i]["seconds"] for p in alike]))
                                   for i, c in enumerate(view["collectives"])]
            merged[clock] = view
        steps_out[name] = merged
    return {"model": model, "machine": machine, "sweep": sweep, "steps": steps_out}
