"""Step time and memory of zero_ref's ZeRO stages against their peers, measured in one run.

    python benchmarks/zero_stages.py [--ranks 2 4] [--steps 12] [--peers ddp zero1 fsdp2 fsdp2_noreshard deepspeed]
                                     [--adam-kernels torch numba] [--zero3 reduce_bucket_size=1e7 ...]

Same model (the course GPT: 4 blocks, d 256, vocab 1024, seq 64 ≈ 3.4M parameters), same data,
same AdamW (zero_ref: torch's arithmetic, and "+numba" its fused kernel, as DeepSpeed's default FusedAdam
is one), fp32, micro-batch 4 per rank, gloo on CPU, one intra-op thread per rank. Prints the
median ms/step of each framework and its ratio to PyTorch DDP at the same rank count, and the
model-state tensor bytes each rank holds after a step (sum of storage bytes, each counted once).
Peers: PyTorch DDP, ZeroRedundancyOptimizer (ZeRO-1), FSDP2 fully_shard (ZeRO-3; with
reshard_after_forward=False ≈ ZeRO-2), DeepSpeed from PyPI (stages 0–3, gradient_clipping 0).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import zero_ref

CFG = dict(vocab_size=1024, seq_len=64, d_model=256, n_heads=4, n_layers=4)
# For memory: ≈110M parameters, so model states dominate the ~200 MiB runtime of each process.
BIG = dict(vocab_size=32000, seq_len=64, d_model=768, n_heads=12, n_layers=12)
LR, MICRO = 1e-3, 4


class PeakRSS:
    """Samples this process's resident memory every 2 ms; ``peak`` is the highest seen."""

    def __init__(self):
        import threading

        import psutil
        self.proc, self.peak, self.running = psutil.Process(), 0, True
        self.baseline = self.proc.memory_info().rss
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        import time
        while self.running:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.002)

    def stop(self) -> int:
        self.running = False
        self.thread.join()
        return self.peak - self.baseline


def make_stepper(name, model, world, zero3=None):
    """(step(idx, targets), state_bytes()) for one framework wrapped around ``model``."""
    import torch

    from zero_ref.measure import unique_storage_bytes
    if name.startswith("zero_ref"):
        from zero_ref.models.gpt import Block
        from zero_ref.optim import AdamConfig
        from zero_ref.stages import STAGES
        # ZeRO-3 shards per transformer block, as the FSDP2 peer is wrapped (fully_shard per block).
        stage = int(name[len("zero_ref")])
        # At DeepSpeed's default stage3_max_reuse_distance, as the DeepSpeed peer runs.
        extra = {"unit_modules": (Block,), "max_reuse_distance": int(1e9), **(zero3 or {})} if stage == 3 else {}
        kernel = name.split("+")[1] if "+" in name else "torch"  # "zero_ref0+numba": the fused Adam kernel
        opt = STAGES[stage](model, adam=AdamConfig(lr=LR, weight_decay=0.0), adam_kernel=kernel, **extra)

        def step(idx, tgt):
            _, loss = model(idx, tgt)
            opt.backward(loss)
            opt.step()

        def state():
            return sum(unique_storage_bytes(v) for v in opt.state_tensors().values())
    elif name == "deepspeed":
        raise ValueError("use deepspeed0..3")
    elif name.startswith("deepspeed"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        ds_cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
                  "gradient_clipping": 0.0, "zero_optimization": {"stage": int(name[-1])},
                  "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
                  "steps_per_print": 10**9}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)

        def step(idx, tgt):
            _, loss = engine(idx, tgt)
            engine.backward(loss)
            engine.step()

        def state():
            opt = engine.optimizer
            tensors = [p for p in engine.module.parameters()] + [p.grad for p in engine.module.parameters()
                                                                   if p.grad is not None]
            inner = getattr(opt, "optimizer", opt)
            for s in inner.state.values():
                tensors += [t for t in s.values() if torch.is_tensor(t)]
            for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "bit16_groups_flat",
                         "averaged_gradients", "fp16_partitioned_groups_flat"):
                v = getattr(opt, attr, None)
                if isinstance(v, (list, tuple)):
                    tensors += [t for t in v if torch.is_tensor(t)]
                elif isinstance(v, dict):
                    tensors += [t for x in v.values() for t in (x if isinstance(x, list) else [x]) if torch.is_tensor(t)]
            return unique_storage_bytes(tensors)
    else:
        if name == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            wrapped = DistributedDataParallel(model)
            opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        elif name == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            from torch.nn.parallel import DistributedDataParallel
            wrapped = DistributedDataParallel(model)
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=LR,
                                          weight_decay=0.0)
        else:  # fsdp2 / fsdp2_noreshard
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (world,))
            reshard = name == "fsdp2"
            for block in model.blocks:
                fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
            wrapped = model
            opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)

        def step(idx, tgt):
            _, loss = wrapped(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)

        def state():
            tensors = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
            tensors += [(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
                        for p in model.parameters() if p.grad is not None]
            for s in opt.state.values() if hasattr(opt, "state") else []:
                tensors += [(t.to_local() if hasattr(t, "to_local") else t) for t in s.values() if torch.is_tensor(t)]
            if name == "zero1":
                for s in opt.optim.state.values():
                    tensors += [t for t in s.values() if torch.is_tensor(t)]
            return unique_storage_bytes(tensors)

    return step, state


def bench(rank, world, name, steps, warmup, big=False, zero3=None):
    """One framework per launch: step time and peak RSS above the pre-model baseline."""
    import time

    import torch
    import torch.distributed as dist

    from zero_ref.models import GPT, GPTConfig, make_batch

    cfg = GPTConfig(**(BIG if big else CFG))
    batches = [make_batch(cfg, MICRO, seed=100 * rank + s) for s in range(steps + warmup)]
    dist.barrier()
    rss = PeakRSS()  # from before the model exists: construction, optimizer state and steps all count
    torch.manual_seed(0)
    step, state = make_stepper(name, GPT(cfg), world, zero3)
    times = []
    for idx, tgt in batches:
        dist.barrier()
        t0 = time.perf_counter()
        step(idx, tgt)
        times.append(time.perf_counter() - t0)
    peak = rss.stop()
    return statistics.median(times[warmup:]) * 1e3, state(), peak


def bench_interleaved(rank, world, names, steps, warmup, zero3=None):
    """All frameworks in the same processes, their steps interleaved, so machine noise hits all alike."""
    import time

    import torch
    import torch.distributed as dist

    from zero_ref.models import GPT, GPTConfig, make_batch

    cfg = GPTConfig(**CFG)
    batches = [make_batch(cfg, MICRO, seed=100 * rank + s) for s in range(steps + warmup)]
    steppers = {}
    for name in names:
        torch.manual_seed(0)
        steppers[name] = make_stepper(name, GPT(cfg), world, zero3)
    times = {name: [] for name in names}
    for i, (idx, tgt) in enumerate(batches):
        for name in (names if i % 2 else names[::-1]):  # alternate the order too
            dist.barrier()
            t0 = time.perf_counter()
            steppers[name][0](idx, tgt)
            times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(times[name][warmup:]) * 1e3, steppers[name][1](), 0) for name in names}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--memory", action="store_true",
                    help="use the ≈110M-parameter model and report peak RSS above the pre-model baseline")
    ap.add_argument("--peers", nargs="+",
                    default=["ddp", "zero1", "fsdp2_noreshard", "fsdp2", "deepspeed0", "deepspeed1", "deepspeed2",
                             "deepspeed3"])
    ap.add_argument("--adam-kernels", nargs="+", default=["torch", "numba"], choices=["torch", "numba"],
                    help="zero_ref's Adam step: torch's arithmetic, and/or the fused kernel DeepSpeed's FusedAdam "
                         "corresponds to")
    ap.add_argument("--zero3", nargs="*", default=[], metavar="KNOB=N",
                    help="ZeroStage3 keywords for zero_ref's stage 3, e.g. reduce_bucket_size=1e7 max_reuse_distance=0 "
                         "(default: DeepSpeed's defaults)")
    args = ap.parse_args(argv)
    zero3 = {k: int(float(v)) for k, v in (kv.split("=", 1) for kv in args.zero3)}
    names = [f"zero_ref{st}" + ("" if k == "torch" else f"+{k}") for k in args.adam_kernels for st in range(4)]
    names += args.peers
    for world in args.ranks:
        rows = {}
        if args.memory:  # one framework per launch: each process's peak RSS is its own
            for name in names:
                try:
                    res = zero_ref.launch(bench, world, name, args.steps, args.warmup, True, zero3, timeout=900,
                                          echo=False)
                    rows[name] = tuple(max(r[k] for r in res) if k else statistics.median(r[0] for r in res)
                                       for k in range(3))
                except zero_ref.LaunchError as e:
                    rows[name] = None
                    print(f"{name}: failed: {str(e).splitlines()[0]}", file=sys.stderr)
        else:
            res = zero_ref.launch(bench_interleaved, world, names, args.steps, args.warmup, zero3, timeout=1800,
                                  echo=False)
            for name in names:
                rows[name] = (statistics.median(r[name][0] for r in res), max(r[name][1] for r in res), 0)
        base = rows.get("ddp")
        print(f"\n{world} ranks (median ms/step over ranks and {args.steps} steps; state = model-state tensor MiB "
              f"per rank" + ("; peak = peak RSS above the pre-model baseline, MiB, max over ranks)" if args.memory
                              else "; frameworks interleaved step by step in the same processes)"))
        print(f"{'framework':<18}{'ms/step':>9}{'vs DDP':>8}{'state MiB':>11}" + (f"{'peak MiB':>10}" if args.memory else ""))
        for name, row in rows.items():
            if row is None:
                print(f"{name:<18}{'failed':>9}")
                continue
            ratio = f"{row[0] / base[0]:.2f}" if base else "-"
            peak = f"{row[2] / 2**20:>10.0f}" if args.memory else ""
            print(f"{name:<18}{row[0]:>9.1f}{ratio:>8}{row[1] / 2**20:>11.2f}{peak}")


if __name__ == "__main__":
    main()
