"""A real zero_ref step under torch.profiler, and its phases and collectives read back from the trace.

    from zero_ref.profiling.profile import StepSpec
    from zero_ref.profiling.torch_trace import profile_trace, trace_spans
    paths = profile_trace(StepSpec(stage=1, micro_batch=4), 2, "traces/")  # one Chrome trace per rank
    spans = trace_spans(paths[0])       # [{"name", "track", "start", "end"}] of the median step

The traces open in ui.perfetto.dev beside the simulator's (``sim.write_chrome_trace``);
``sim.fit_local.sim_spans`` gives a simulated step in the form ``trace_spans`` returns, so both draw on
one Gantt (chapter 28). On a CPU rank gloo runs each collective on a worker thread of its own
(``gloo:all_reduce``, ...) while the calling thread waits inside the c10d op.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict

import torch.distributed as dist

from zero_ref.launcher import launch
from zero_ref.models import GPTConfig, make_batch
from zero_ref.profiling.profile import COURSE_GPT, StepSpec, _build, _one_step


def _trace_rank(rank, world, spec, model, steps, warmup, out_dir, seed):
    from torch.profiler import ProfilerActivity, profile, record_function

    cfg = GPTConfig(**model)
    spec = StepSpec(**spec)
    model_, opt = _build(spec, cfg)
    batches = [make_batch(cfg, spec.micro_batch, seed=seed + 1000 * rank + m) for m in range(spec.gas)]
    phase: dict = {}
    for _ in range(warmup):
        _one_step(model_, opt, batches, phase)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            dist.barrier()
            with record_function("step"):
                for idx, targets in batches:
                    with record_function("forward"):
                        _, loss = model_(idx, targets)
                    with record_function("backward"):
                        opt.backward(loss)
                    with record_function("optimizer"):
                        opt.step()
    path = os.path.join(out_dir, f"zero_ref_rank{rank}.json")
    prof.export_chrome_trace(path)
    return path


def profile_trace(spec: StepSpec, world_size: int, out_dir, *, model: dict | None = None, steps: int = 3,
                  warmup: int = 2, seed: int = 0, timeout: float = 300.0) -> list[str]:
    """``steps`` steps of ``spec`` under ``torch.profiler`` on every rank (after ``warmup`` steps), each
    annotated 'step' and its phases 'forward', 'backward', 'optimizer'. Writes
    ``out_dir``/zero_ref_rank{r}.json (Chrome traces: open them in ui.perfetto.dev) and returns
    their paths in rank order."""
    if not isinstance(spec, StepSpec):
        raise TypeError(f"spec must be a StepSpec, got {type(spec).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    os.makedirs(out_dir, exist_ok=True)
    return launch(_trace_rank, world_size, asdict(spec), {**COURSE_GPT, **(model or {})}, steps, warmup,
                  str(out_dir), seed, timeout=timeout, echo=False)


PHASES = ("forward", "backward", "optimizer")


def trace_spans(trace, step="median") -> list[dict]:
    """The phases and collectives of one step of a torch.profiler Chrome trace (a path or the loaded
    dict): [{"name", "track", "start", "end"}] in seconds from that step's 'step' annotation.
    ``step``: the index of the step, or 'median' (the step of median duration: profiling adds
    overhead and load adds noise, so one step alone says little). Tracks: 'compute' for the phase
    annotations, 'comm' for gloo's collective work (``gloo:*``, run on gloo's own threads),
    'comm call' for the c10d op on the calling thread."""
    if not isinstance(trace, dict):
        with open(trace) as f:
            trace = json.load(f)
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    steps = sorted((e for e in events if e["name"] == "step" and e.get("cat") == "user_annotation"),
                   key=lambda e: e["ts"])
    if not steps:
        raise ValueError("no 'step' annotation in the trace: record it with "
                         "zero_ref.profiling.torch_trace.profile_trace")
    if step == "median":
        chosen = sorted(steps, key=lambda e: e["dur"])[len(steps) // 2]
    elif isinstance(step, int) and -len(steps) <= step < len(steps):
        chosen = steps[step]
    else:
        raise ValueError(f"step must be 'median' or an index below {len(steps)}, got {step!r}")
    t0, t1 = chosen["ts"], chosen["ts"] + chosen["dur"]
    spans = []
    for e in events:
        if not t0 <= e["ts"] < t1:
            continue
        name = e["name"]
        if e.get("cat") == "user_annotation" and name in PHASES + ("step",):
            track = "step" if name == "step" else "compute"
        elif name.startswith("gloo:"):
            track, name = "comm", name.removeprefix("gloo:")
        elif name.startswith("c10d::"):
            track = "comm call"
        else:
            continue
        start = (e["ts"] - t0) * 1e-6
        spans.append({"name": name, "track": track, "start": start, "end": start + e["dur"] * 1e-6})
    return sorted(spans, key=lambda s: (s["start"], s["track"]))
