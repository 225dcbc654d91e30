"""A trial run: a DeepSpeed config trained for real through ``zero_ref.initialize`` on gloo ranks.

The check at the end of planning (chapter 30): the config a plan wrote is handed to the engine
exactly as a training script would, on a small model and a few ranks, and the run reports what
the plan predicted — step time, bytes held per rank by category, bytes sent per collective:

    from zero_ref.profiling import trial
    run = trial.run_config(ds_config, world_size=2, steps=3)
    run["cpu"]["step"], run["wall"]["step"]     # seconds per optimizer step (two clocks, see below)
    run["memory"]                               # {"params", "grads", "optimizer"}: bytes on every rank
    run["comm"]                                 # {op: {"calls", "bytes"}} of one optimizer step (rank 0)

Each optimizer step is ``gradient_accumulation_steps`` micro-steps of
``engine(idx, targets)`` / ``engine.backward(loss)`` / ``engine.step()``. Steps are timed on the two
clocks of ``zero_ref.profiling.profile``: 'cpu', the CPU seconds the rank's process spends (every thread:
gloo's too), from the step of median CPU time — the step's work, steady on a shared machine — and
'wall', the fastest step's wall clock. Each number is the mean over ranks. The returned dict has
the keys ``sim.fit_local`` reads from a measured step (stage, micro_batch, gas, world_size), so a
fitted simulator predicts the trial directly: ``fit.predict(run)``.
"""
from __future__ import annotations

import statistics

from zero_ref.launcher import launch
# COURSE_GPT: 4 blocks, d 256, vocab 1024, seq 64: 3.44M params
from zero_ref.profiling.profile import COURSE_GPT, _clocks


def _trial_rank(rank, world, config, model, steps, warmup, seed):
    import torch
    import torch.distributed as dist

    import zero_ref.ds.engine as ze
    from zero_ref import comm
    from zero_ref.measure import unique_storage_bytes
    from zero_ref.models import GPT, GPTConfig, make_batch

    cfg = GPTConfig(**model)
    torch.manual_seed(seed)
    engine, *_ = ze.initialize(model=GPT(cfg), config=config)
    mb, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    cpu, wall, losses, log = [], [], [], None
    for s in range(warmup + steps):
        batches = [make_batch(cfg, mb, seed=seed + 10_000 * s + 100 * rank + m) for m in range(gas)]
        dist.barrier()
        with comm.recording() as rec:
            start = _clocks()
            total = 0.0
            for idx, targets in batches:
                _, loss = engine(idx, targets)
                engine.backward(loss)
                engine.step()
                total += loss.item() / gas
            end = _clocks()
        if s >= warmup:
            wall.append(end[0] - start[0])
            cpu.append(end[1] - start[1])
            log = rec
        losses.append(total)
    memory = {k: unique_storage_bytes(v) for k, v in engine.optimizer.state_tensors().items()}
    return {"stage": engine.zero_optimization_stage(), "micro_batch": mb, "gas": gas, "world_size": world,
            "precision": engine.config.precision, "num_params": sum(p.numel() for p in engine.module.parameters()),
            "cpu": sorted(cpu)[len(cpu) // 2], "wall": min(wall), "wall_median": statistics.median(wall),
            "memory": memory, "comm": log.by_op(), "losses": losses}


def run_config(config: dict, world_size: int, *, model: dict | None = None, steps: int = 3, warmup: int = 1,
               seed: int = 0, timeout: float = 300.0) -> dict:
    """Train ``model`` (GPTConfig fields over ``COURSE_GPT``) with ``config`` on ``world_size`` gloo ranks for
    ``warmup`` + ``steps`` optimizer steps; return what the run measured (see the module docstring):
    {"stage", "micro_batch", "gas", "world_size", "seq_len", "precision", "num_params", "model",
    "cpu": {"step"}, "wall": {"step"}, "wall_median", "memory": [per rank {"params", "grads",
    "optimizer"}], "comm": {op: {"calls", "bytes", "wire_bytes"}}, "losses": [per step, rank 0]}."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (a DeepSpeed config), got {type(config).__name__}")
    for name, v, least in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {v!r}")
    from zero_ref.config import parse
    parse(config, dp=world_size)  # a bad config fails here, with the key's name, before any rank starts
    model = {**COURSE_GPT, **(model or {})}
    ranks = launch(_trial_rank, world_size, config, model, steps, warmup, seed, timeout=timeout, echo=False)
    first = ranks[0]
    mean = lambda key: sum(r[key] for r in ranks) / len(ranks)
    return {**{k: first[k] for k in ("stage", "micro_batch", "gas", "world_size", "precision", "num_params")},
            "seq_len": model["seq_len"], "model": model, "cpu": {"step": mean("cpu")}, "wall": {"step": mean("wall")},
            "wall_median": mean("wall_median"), "memory": [r["memory"] for r in ranks], "comm": first["comm"],
            "losses": first["losses"]}
