"""Lab: one training script, two engines — the import is the only difference.

    torchrun --nproc_per_node=2 -m course.labs.either_engine --engine zero_ref --stage 2
    torchrun --nproc_per_node=2 -m course.labs.either_engine --engine deepspeed --stage 2

``--engine`` picks ``import zero_ref.ds as ds`` or ``import deepspeed as ds``; everything after that
line is the same code: ``ds.initialize`` with the same config dict, ``engine(batch)``,
``engine.backward(loss)``, ``engine.step()``, and DeepSpeed's accessors. The config holds only keys
both engines implement (batch keys, an AdamW optimizer section, a WarmupLR schedule, gradient
clipping, zero_optimization.stage and bucket size, bf16). ``torch_adam`` makes DeepSpeed use
torch's AdamW on CPU instead of building its fused kernel (tens of seconds the first time).

Each rank trains the course GPT on its slice of a deterministic global batch. Rank 0 prints the
loss per optimizer step and, last, a line ``RESULT {json}`` with the losses, per-step times and the
tensor bytes each rank holds after training (every live tensor's storage, counted once: parameters,
gradient buffers, optimizer states, whatever the engine keeps), which
benchmarks/engine_vs_deepspeed.py reads. Runs on CPU (gloo) or one GPU per rank.
"""
import argparse
import gc
import json
import os
import time
import warnings

import torch
import torch.distributed as dist

from zero_ref.measure import unique_storage_bytes
from zero_ref.models import GPT, GPTConfig, make_batch


def import_engine(name: str):
    """The one engine-specific line of the script."""
    if name == "deepspeed":
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed as ds
    else:
        import zero_ref.ds as ds
    return ds


def ds_config(args) -> dict:
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.gas,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.01, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": args.lr / 10, "warmup_max_lr": args.lr,
                                                     "warmup_num_steps": 4, "warmup_type": "linear"}},
        "bf16": {"enabled": args.bf16},
        "zero_optimization": {"stage": args.stage, "reduce_bucket_size": int(5e5)},
    }


def live_tensor_bytes() -> int:
    """Bytes of every tensor alive in this process (each storage once)."""
    gc.collect()
    with warnings.catch_warnings():  # (isinstance on some deprecated torch objects warns)
        warnings.simplefilter("ignore")
        tensors = [o for o in gc.get_objects() if torch.is_tensor(o) and o.device.type != "meta"]
    return unique_storage_bytes(tensors)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("zero_ref", "deepspeed"), default="zero_ref")
    ap.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=2)
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps")
    ap.add_argument("--gas", type=int, default=2, help="gradient_accumulation_steps")
    ap.add_argument("--micro-batch", type=int, default=2, help="train_micro_batch_size_per_gpu")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=128)
    args = ap.parse_args(argv)

    ds = import_engine(args.engine)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = GPTConfig(n_layers=args.layers, d_model=args.d_model, bias=False)
    model = GPT(cfg)
    n_params = sum(p.numel() for p in model.parameters())  # (before ZeRO-3 partitions them)
    engine, _, _, _ = ds.initialize(model=model, model_parameters=model.parameters(), config=ds_config(args))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = next(engine.module.parameters()).device

    losses, times = [], []
    for step in range(args.steps):
        # the global batch of this step, the same whatever the engine; this rank's micro-batches of it
        idx, targets = make_batch(cfg, engine.train_batch_size(), seed=step, device=device)
        per = engine.train_micro_batch_size_per_gpu()
        start, total = time.perf_counter(), 0.0
        for micro in range(engine.gradient_accumulation_steps()):
            lo = (micro * world + rank) * per
            _, loss = engine(idx[lo:lo + per], targets[lo:lo + per])
            engine.backward(loss)
            engine.step()
            total += loss.item()
        times.append(time.perf_counter() - start)
        mean = torch.tensor([total / engine.gradient_accumulation_steps()], device=device)
        dist.all_reduce(mean)  # the step's loss over all ranks
        losses.append(mean.item() / world)
        if rank == 0:
            print(f"step {engine.global_steps}: loss {losses[-1]:.6f}  lr {engine.get_lr()[0]:.2e}")

    held = [None] * world
    dist.all_gather_object(held, live_tensor_bytes())
    if rank == 0:
        print("RESULT " + json.dumps({"engine": args.engine, "stage": engine.zero_optimization_stage(),
                                      "ranks": world, "params": n_params,
                                      "train_batch_size": engine.train_batch_size(), "losses": losses,
                                      "step_s": times, "tensor_bytes": held}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
