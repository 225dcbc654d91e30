"""Step time of zero_ref's pipeline schedules against torch.distributed.pipelining, and the bubble:
measured vs simulated vs closed form, in one run.

    python benchmarks/pipeline.py [--stages 2 4] [--microbatches 8] [--steps 8] [--warmup 2]

Same model (the course GPT, untied head: d 128, 4 heads, seq 64, vocab 1024, 2 blocks per stage),
same data, same AdamW, fp32, micro-batch 2, gloo on CPU, one intra-op thread per rank. Every
schedule lives in the same processes and their steps are interleaved (a fresh order each round),
so machine noise hits all alike. For each pipeline depth p:

- ``zero_ref gpipe`` / ``zero_ref 1f1b`` / ``zero_ref interleaved`` (v = 2):
  ``zero_ref.parallel.pipeline.Pipeline`` on ``split_gpt`` stages;
- ``torch gpipe`` / ``torch 1f1b`` / ``torch interleaved``: ``ScheduleGPipe``, ``Schedule1F1B``,
  ``ScheduleInterleaved1F1B`` over ``PipelineStage`` wrappers of the same stage modules (the last
  stage's module returns logits; the schedule's ``loss_fn`` is the same cross-entropy).

Prints the median ms/step and each schedule's speed relative to torch's version of it; then, for
zero_ref's schedules, the bubble measured on the ranks (idle share of p × the step, from the
perf_counter timestamps of every forward and backward), the simulator's prediction for the same
plan (``sim.pipeline_timeline`` with the measured mean forward and backward times, communication
free), and the closed form (p − 1)/(v·m + p − 1).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

import zero_ref

CFG = dict(vocab_size=1024, seq_len=64, d_model=128, n_heads=4, tie_embeddings=False)
MICRO, LR = 2, 1e-3
OURS = {"zero_ref gpipe": ("gpipe", 1), "zero_ref 1f1b": ("1f1b", 1), "zero_ref interleaved": ("interleaved", 2)}
THEIRS = {"torch gpipe": "ScheduleGPipe", "torch 1f1b": "Schedule1F1B", "torch interleaved": "ScheduleInterleaved1F1B"}


class _Logits(torch.nn.Module):
    """A last GPTStage that returns logits: torch's schedules apply ``loss_fn`` themselves."""

    def __init__(self, stage):
        super().__init__()
        self.stage = stage

    def forward(self, x):
        s = self.stage
        for block in s.blocks:
            x = block(x)
        return s.head(s.ln_f(x))


def worker(rank, world, m, steps, warmup, seed):
    import torch.nn.functional as F
    from torch.distributed import pipelining as tp

    from zero_ref.models import GPT, GPTConfig, make_batch
    from zero_ref.parallel.pipeline import Pipeline, split_gpt

    cfg = GPTConfig(n_layers=4 * world, **CFG)  # 2 blocks per virtual stage at v = 2
    torch.manual_seed(0)
    model = GPT(cfg)
    runners = {}
    for name, (schedule, v) in OURS.items():
        chunks = split_gpt(model, world * v, costs="layers")[rank::world]
        pipe = Pipeline(chunks, rank, list(range(world)), schedule=schedule, microbatches=m)
        opt = torch.optim.AdamW([p for c in chunks for p in c.parameters()], lr=LR, foreach=False)

        def ours(idx, tgt, pipe=pipe, opt=opt):
            stats = pipe.train_step(list(zip(idx.chunk(m), tgt.chunk(m))))
            opt.step()
            opt.zero_grad(set_to_none=False)
            return stats
        runners[name] = ours

    def loss_fn(logits, tgt):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))

    for name, cls in THEIRS.items():
        v = 2 if "interleaved" in name else 1
        chunks = split_gpt(model, world * v, costs="layers")
        stages = [tp.PipelineStage(_Logits(chunks[vs]) if vs == world * v - 1 else chunks[vs], vs, world * v,
                                   torch.device("cpu")) for vs in range(rank, world * v, world)]
        sched = getattr(tp, cls)(stages if v > 1 else stages[0], m, loss_fn=loss_fn)
        opt = torch.optim.AdamW([p for s in stages for p in s.submod.parameters()], lr=LR, foreach=False)
        first, last = rank == 0, rank == world - 1

        def theirs(idx, tgt, sched=sched, opt=opt, first=first, last=last):
            args = (idx,) if first else ()
            sched.step(*args, **({"target": tgt} if last else {}))
            opt.step()
            opt.zero_grad(set_to_none=False)
        runners[name] = theirs

    rng = random.Random(seed)
    times = {k: [] for k in runners}
    stats = {k: [] for k in OURS}
    for step in range(warmup + steps):
        idx, tgt = make_batch(cfg, MICRO * m, seed=step)
        order = list(runners)
        rng.shuffle(order)  # the same order on every rank (same seed)
        for name in order:
            torch.distributed.barrier()
            t0 = time.perf_counter()
            out = runners[name](idx, tgt)
            torch.distributed.barrier()  # a step ends when the slowest stage is done
            if step >= warmup:
                times[name].append(time.perf_counter() - t0)
                if name in stats:
                    stats[name].append(out)
    return times, stats


def report(p, m, results):
    import sim
    from zero_ref.parallel.pipeline import mean_op_times, measured_bubble

    times = {k: statistics.median(max(r[0][k][i] for r in results) for i in range(len(results[0][0][k])))
             for k in results[0][0]}
    print(f"\n### p = {p} stages, m = {m} micro-batches\n")
    print("| schedule | ms/step | vs torch's same schedule |")
    print("|---|---:|---:|")
    for ours, theirs in zip(OURS, THEIRS):
        print(f"| {ours} | {1e3 * times[ours]:.1f} | {times[theirs] / times[ours]:.2f}× |")
        print(f"| {theirs} | {1e3 * times[theirs]:.1f} | 1.00× |")
    print("\n| zero_ref schedule | t_f ms | t_b ms | measured bubble | simulated | closed form (p−1)/(v·m+p−1) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (schedule, v) in OURS.items():
        per_step = list(zip(*(r[1][name] for r in results)))  # each step: every rank's StepStats
        bubbles = [measured_bubble(list(s)) for s in per_step]
        t_f, t_b = mean_op_times([s for step in per_step for s in step])
        slots = sim.pipeline_timeline(p, m, schedule, t_f, t_b, v)  # per op: per chunk when interleaved
        span = max(s.end for s in slots)
        simulated = 1 - sum(s.end - s.start for s in slots) / (p * span)
        print(f"| {name} (v = {v}) | {1e3 * t_f:.2f} | {1e3 * t_b:.2f} | {statistics.median(bubbles):.3f} | "
              f"{simulated:.3f} | {sim.bubble_fraction(p, m, v):.3f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    for p in args.stages:
        results = zero_ref.launch(worker, p, args.microbatches, args.steps, args.warmup, 0, timeout=1800)
        report(p, args.microbatches, results)


if __name__ == "__main__":
    main()
