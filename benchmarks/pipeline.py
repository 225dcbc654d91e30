"""Step time of zero_ref's pipeline schedules against torch.distributed.pipelining, and the bubble:
measured vs simulated vs closed form, in one run.

    python benchmarks/pipeline.py [--stages 2 4] [--microbatches 8] [--steps 8] [--warmup 2] [--no-3d]

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

3D (8 ranks, tp = pp = dp = 2, 1F1B over 4 micro-batches, global batch 16): ``zero_ref ThreeD``
(tensor-parallel stages with vocab-parallel embedding and head, ZeRO-1 over dp) against PyTorch's
own composition, as torchtitan builds it: ``torch.distributed.pipelining`` Schedule1F1B over
stages whose blocks are ``parallelize_module``-d on the tp mesh (QKV rows reordered per rank as in
benchmarks/tensor_parallel.py), wrapped in FSDP2 ``fully_shard`` on the dp mesh
(``reshard_after_forward=False``). PyTorch's variant keeps the embedding and head replicated over
tp and shards parameters, gradients and optimizer states over dp (ZeRO-3-like); ours shards the
vocabulary over tp and only the optimizer states over dp (ZeRO-1). Untied head in both.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

import zero_ref
from zero_ref.parallel.pipeline import split_gpt

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
    from zero_ref.parallel.pipeline import Pipeline

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


CFG3D = dict(vocab_size=1024, seq_len=64, d_model=128, n_heads=4, n_layers=4, tie_embeddings=False)


def worker_3d(rank, world, m, steps, warmup, seed):
    import sys
    import types
    from pathlib import Path

    import torch.nn.functional as F
    from torch.distributed import pipelining as tpp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from zero_ref.models import GPT, GPTConfig, make_batch
    from zero_ref.parallel.groups import build_groups
    from zero_ref.recipes.three_d import ThreeD
    from zero_ref.parallel.topology import Topology

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tensor_parallel import _local_heads_forward

    cfg, (pp, dp, tp) = GPTConfig(**CFG3D), (2, 2, 2)
    torch.manual_seed(0)
    ours = ThreeD(GPT(cfg), build_groups(Topology(tp=tp, pp=pp, dp=dp)), microbatches=m)

    mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))  # the same rank grid
    p, d = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    torch.manual_seed(0)
    stage = split_gpt(GPT(cfg), pp)[p]
    c = cfg.d_model
    order = torch.cat([torch.arange(j * c + r * c // tp, j * c + (r + 1) * c // tp) for r in range(tp) for j in range(3)])
    for block in stage.blocks:
        with torch.no_grad():
            block.attn.qkv.weight.copy_(block.attn.qkv.weight[order])
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[order])
        block.attn.local_heads = block.attn.n_heads // tp
        block.attn.forward = types.MethodType(_local_heads_forward, block.attn)
        parallelize_module(block, mesh["tp"], {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                                               "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
    mod = _Logits(stage) if stage.is_last else stage
    fully_shard(mod, mesh=mesh["dp"], reshard_after_forward=False)
    sched = tpp.Schedule1F1B(tpp.PipelineStage(mod, p, pp, torch.device("cpu"), group=mesh["pp"].get_group()), m,
                             loss_fn=lambda lg, t: F.cross_entropy(lg.reshape(-1, lg.size(-1)), t.reshape(-1)))
    opt = torch.optim.AdamW(mod.parameters(), lr=LR, foreach=False)

    def theirs(idx, tgt):
        n = idx.shape[0] // dp
        losses = []
        sched.step(*((idx[d * n:(d + 1) * n],) if p == 0 else ()),
                   **({"target": tgt[d * n:(d + 1) * n], "losses": losses} if p == pp - 1 else {}))
        opt.step()
        opt.zero_grad()
        return sum(x.item() for x in losses) / len(losses) if losses else None

    runners = {"zero_ref ThreeD": lambda idx, tgt: ours.train_step(idx, tgt)[1], "torch pp+tp+fsdp2": theirs}
    rng = random.Random(seed)
    times, last = {k: [] for k in runners}, {}
    for step in range(warmup + steps):
        idx, tgt = make_batch(cfg, 16, seed=step)
        order = list(runners)
        rng.shuffle(order)
        for name in order:
            torch.distributed.barrier()
            t0 = time.perf_counter()
            last[name] = runners[name](idx, tgt)
            torch.distributed.barrier()
            if step >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times, last


def report_3d(results, m):
    times = {k: statistics.median(max(r[0][k][i] for r in results) for i in range(len(results[0][0][k])))
             for k in results[0][0]}
    ours, theirs = times["zero_ref ThreeD"], times["torch pp+tp+fsdp2"]
    losses = [r[1]["torch pp+tp+fsdp2"] for r in results if r[1]["torch pp+tp+fsdp2"] is not None]
    print(f"\n### 3D: tp = pp = dp = 2 on 8 ranks, 1F1B, m = {m}\n")
    print("| framework | ms/step | vs torch | last loss (ours: global mean; torch: dp replica 0) |")
    print("|---|---:|---:|---:|")
    print(f"| zero_ref ThreeD (ZeRO-1) | {1e3 * ours:.1f} | {theirs / ours:.2f}× | {results[0][1]['zero_ref ThreeD']:.4f} |")
    print(f"| torch pipelining + parallelize_module + fully_shard | {1e3 * theirs:.1f} | 1.00× | {losses[0]:.4f} |")


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
    ap.add_argument("--no-3d", action="store_true", help="skip the 8-rank 3D comparison")
    args = ap.parse_args()
    for p in args.stages:
        results = zero_ref.launch(worker, p, args.microbatches, args.steps, args.warmup, 0, timeout=1800)
        report(p, args.microbatches, results)
    if not args.no_3d:
        report_3d(zero_ref.launch(worker_3d, 8, 4, args.steps, args.warmup, 0, timeout=1800), 4)


if __name__ == "__main__":
    main()
