"""Step time and bytes of zero_ref's compressed gradient all-reduce against PyTorch DDP's comm hooks.

    python benchmarks/compression.py [--ranks 2] [--steps 12] [--warmup 3] [--rank 4]

Same model (the course GPT: 4 blocks, d 256, vocab 1024, seq 64 ≈ 3.4M parameters), same data,
same AdamW, fp32, micro-batch 4 per rank, gloo on CPU, one intra-op thread per rank; every
framework steps in the same processes, interleaved step by step, so machine noise hits all alike.
zero_ref: ``CompressedDataParallel`` with ``allreduce_hook``, ``CastCompression('fp16'/'bf16')``,
``OneBit()`` and ``PowerSGD(rank)``. Peers: torch DDP with ``default_hooks.allreduce_hook``,
``fp16_compress_hook`` and ``powerSGD_hook`` (rank r,
start_powerSGD_iter = 2, error feedback and warm start on, as ours). Compression starts after the
warm-up steps for every framework; the timed steps are all compressed.

Bytes per step per rank: zero_ref's from ``comm.recording``; the peers' by counting what the
hooks hand to ``torch.distributed.all_reduce`` (wrapped in each rank for this purpose). PyTorch
has no 1-bit hook (DeepSpeed's 1-bit Adam is an optimizer with its own NCCL/MPI backends), and its
``bf16_compress_hook`` refuses to register without CUDA/NCCL, so ``OneBit`` and bf16 are compared
with DDP's all-reduce only.
"""
from __future__ import annotations

import argparse
import statistics

import zero_ref

CFG = dict(vocab_size=1024, seq_len=64, d_model=256, n_heads=4, n_layers=4)
LR, MICRO = 1e-3, 4


def bench(rank, world, steps, warmup, r):
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    from zero_ref import comm, compression as C
    from zero_ref.models import GPT, GPTConfig, make_batch
    from zero_ref.optim import AdamConfig

    sent = [0]
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):  # what the torch hooks hand to the wire
        sent[0] += tensor.numel() * tensor.element_size()
        return real_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    cfg = GPTConfig(**CFG)
    batches = [make_batch(cfg, MICRO, seed=100 * rank + s) for s in range(steps + warmup)]
    ours = {"fp32": lambda: C.allreduce_hook, "fp16": lambda: C.CastCompression("fp16"),
            "bf16": lambda: C.CastCompression("bf16"), "1-bit": C.OneBit, f"PowerSGD r{r}": lambda: C.PowerSGD(r)}
    peers = {"fp32": (None, default_hooks.allreduce_hook), "fp16": (None, default_hooks.fp16_compress_hook),
             f"PowerSGD r{r}": (powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=r, start_powerSGD_iter=2),
                                powerSGD_hook.powerSGD_hook)}
    steppers = {}
    for name, make in ours.items():
        torch.manual_seed(0)
        model = GPT(cfg)
        opt = C.CompressedDataParallel(model, make(), adam=AdamConfig(lr=LR, weight_decay=0.0), start_step=2)

        def step(idx, tgt, model=model, opt=opt):
            with comm.recording() as log:
                _, loss = model(idx, tgt)
                opt.backward(loss)
                opt.step()
            return log.total_bytes()
        steppers[("zero_ref", name)] = step
    for name, (state, hook) in peers.items():
        torch.manual_seed(0)
        model = GPT(cfg)
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)

        def step(idx, tgt, ddp=ddp, opt=opt):
            sent[0] = 0
            _, loss = ddp(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            return sent[0]
        steppers[("torch DDP", name)] = step
    times = {k: [] for k in steppers}
    sizes = {k: [] for k in steppers}
    keys = list(steppers)
    for i, (idx, tgt) in enumerate(batches):
        for k in (keys if i % 2 else keys[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            nbytes = steppers[k](idx, tgt)
            times[k].append(time.perf_counter() - t0)
            sizes[k].append(nbytes)
    return {k: (statistics.median(times[k][warmup:]) * 1e3, sizes[k][-1]) for k in keys}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rank", type=int, default=4, help="PowerSGD's matrix approximation rank")
    args = ap.parse_args(argv)
    if args.warmup < 3:
        ap.error("--warmup must be >= 3: compression starts at step 2 (PowerSGD's start_powerSGD_iter)")
    res = zero_ref.launch(bench, args.ranks, args.steps, args.warmup, args.rank, timeout=1800, echo=False)
    rows = {k: (statistics.median(r[k][0] for r in res), res[0][k][1]) for k in res[0]}
    base_ms, base_bytes = rows[("torch DDP", "fp32")]
    print(f"\n{args.ranks} ranks, {args.steps} timed steps (median ms/step over ranks; bytes = payload this rank "
          f"hands to collectives per step)")
    print(f"{'framework':<11}{'hook':<13}{'ms/step':>9}{'vs DDP':>8}{'vs peer':>9}{'MiB/step':>10}{'bytes ratio':>13}")
    for (fw, name), (ms, nbytes) in rows.items():
        peer = rows.get(("torch DDP", name)) if fw == "zero_ref" else None
        vs_peer = f"{ms / peer[0]:.2f}" if peer else "-"
        print(f"{fw:<11}{name:<13}{ms:>9.1f}{ms / base_ms:>8.2f}{vs_peer:>9}{nbytes / 2**20:>10.3f}"
              f"{nbytes / base_bytes:>13.4f}")


if __name__ == "__main__":
    main()
