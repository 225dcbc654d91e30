"""Step time of zero_ref's ZeRO-Offload against DeepSpeed's, measured in one run.

    python benchmarks/offload.py [--ranks 2 4] [--stages 1 2 3] [--steps 12] [--precision fp32|bf16]

Same model (the course GPT: 4 blocks, d 256, vocab 1024, seq 64 ≈ 3.4M parameters), same data, same
AdamW (lr 1e-3, no weight decay), micro-batch 4 per rank, gloo on CPU, one intra-op thread per rank
(the CPU Adam runs one thread too: DeepSpeedCPUAdam's OpenMP and zero_ref's Numba both follow it).
For each ZeRO stage: zero_ref without offload, zero_ref with ``offload_optimizer: {device: cpu}``
(Numba CPU Adam, and torch's ops), DeepSpeed 0.19.8 without and with the same offload config
(``DS_ACCELERATOR=cpu``, ``gradient_clipping: 0``; DeepSpeedCPUAdam JIT-builds once, 30–45 s, then
is cached). All five of a stage are built in the same ranks and their steps interleaved (alternating
order), so machine noise hits all alike. Prints the median ms per training step and per optimizer step (``step()`` alone: the
unscale / norm / Adam / copy-back part that offload moves to the host), and the ratio of each
zero_ref row to DeepSpeed's offload row at the same stage and rank count.

On a CPU-only machine "offload" moves nothing across a PCIe link (host and device are the same
memory): what this measures is the cost of the offload machinery itself — the extra host copies
of gradients and parameters, and the CPU Adam kernel — against DeepSpeed's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import zero_ref

CFG = dict(vocab_size=1024, seq_len=64, d_model=256, n_heads=4, n_layers=4)
LR, MICRO = 1e-3, 4


def make_stepper(name, stage, precision, model):
    """(forward_backward(idx, targets), step()) for one framework wrapped around ``model``."""
    if name.startswith("zero_ref"):
        from zero_ref.optim import AdamConfig
        from zero_ref.stages import STAGES
        off = {"device": "cpu"} if "offload" in name else None
        # stage 3 at DeepSpeed's default stage3_max_reuse_distance, as the DeepSpeed peers run
        extra = {"max_reuse_distance": int(1e9)} if stage == 3 else {}
        opt = STAGES[stage](model, adam=AdamConfig(lr=LR, weight_decay=0.0), precision=precision,
                            offload_optimizer=off, cpu_adam="torch" if name.endswith("torch") else "numba", **extra)

        def forward_backward(idx, tgt):
            _, loss = model(idx, tgt)
            opt.backward(loss)

        return forward_backward, opt.step
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    zero = {"stage": stage}
    if "offload" in name:
        zero["offload_optimizer"] = {"device": "cpu"}
    ds_cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
              "gradient_clipping": 0.0, "zero_optimization": zero, "steps_per_print": 10**9,
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}}
    if precision == "bf16":
        ds_cfg["bf16"] = {"enabled": True}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)

    def forward_backward(idx, tgt):
        _, loss = engine(idx, tgt)
        engine.backward(loss)

    return forward_backward, engine.step


def bench(rank, world, names, stage, precision, steps, warmup):
    """Every framework in the same processes, their steps interleaved (alternating order), so machine
    noise hits all alike; per framework the median ms of a whole step and of ``step()`` alone."""
    import time

    import torch
    import torch.distributed as dist

    from zero_ref.models import GPT, GPTConfig, make_batch

    cfg = GPTConfig(**CFG)
    batches = [make_batch(cfg, MICRO, seed=100 * rank + s) for s in range(steps + warmup)]
    steppers = {}
    for name in names:
        torch.manual_seed(0)
        steppers[name] = make_stepper(name, stage, precision, GPT(cfg))
    total = {name: [] for name in names}
    in_step = {name: [] for name in names}
    for i, (idx, tgt) in enumerate(batches):
        for name in (names if i % 2 else names[::-1]):
            forward_backward, step = steppers[name]
            dist.barrier()
            t0 = time.perf_counter()
            forward_backward(idx, tgt)
            t1 = time.perf_counter()
            step()
            t2 = time.perf_counter()
            total[name].append(t2 - t0)
            in_step[name].append(t2 - t1)
    assert torch.get_num_threads() == 1, "a rank ran more than one intra-op thread"
    return {name: (statistics.median(total[name][warmup:]) * 1e3, statistics.median(in_step[name][warmup:]) * 1e3)
            for name in names}


NAMES = ["zero_ref", "zero_ref+offload", "zero_ref+offload/torch", "deepspeed", "deepspeed+offload"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = ap.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    for world in args.ranks:
        print(f"\n{world} ranks, {args.precision} (median over ranks and {args.steps} steps; ms; all frameworks of a "
              "stage interleaved step by step in the same processes)")
        print(f"{'stage':<7}{'framework':<24}{'ms/step':>9}{'step() ms':>11}{'vs DS offload':>15}")
        for stage in args.stages:
            try:
                res = zero_ref.launch(bench, world, NAMES, stage, args.precision, args.steps, args.warmup,
                                      timeout=1800, echo=False)
                rows = {name: (statistics.median(r[name][0] for r in res), statistics.median(r[name][1] for r in res))
                        for name in NAMES}
            except zero_ref.LaunchError as e:
                print(f"stage {stage}: failed: {str(e).splitlines()[0]}", file=sys.stderr)
                continue
            ref = rows["deepspeed+offload"]
            for name, row in rows.items():
                print(f"{stage:<7}{name:<24}{row[0]:>9.1f}{row[1]:>11.1f}{row[0] / ref[0]:>14.2f}×")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
