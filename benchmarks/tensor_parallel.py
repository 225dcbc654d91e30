"""Step time of zero_ref's tensor-parallel GPT against PyTorch's own tensor parallelism, in one run.

    python benchmarks/tensor_parallel.py [--tp 2] [--steps 12] [--warmup 3] [--big]

Same model (the course GPT: 4 blocks, d 256, 4 heads, vocab 1024, seq 64, untied head), same data,
same AdamW, fp32, micro-batch 4, gloo on CPU, one intra-op thread per rank. Every framework lives
in the same processes and their steps are interleaved (alternating order), so machine noise hits
all alike (``--big``: d 1024, 16 heads, seq 128, vocab 8192, ≈ 67M parameters, where the matmuls rather than
per-op overheads dominate). Prints the median ms/step and the speed relative to PyTorch's TP:

- ``torch_tp``: ``torch.distributed.tensor.parallel.parallelize_module`` with ColwiseParallel
  (QKV, fc1, the head with ``loss_parallel``), RowwiseParallel (out-projection, fc2, the vocab-
  sharded embedding) on a 1-D DeviceMesh — the same Megatron partition as ours. PyTorch shards a
  fused QKV weight in one block of rows, so its rows are first reordered to [Q_r, K_r, V_r] per
  rank, and the attention runs on the local heads (as PyTorch's TP tutorial does).
- ``zero_ref_tp`` and ``zero_ref_sp``: ``zero_ref.parallel.tensor.TensorParallelGPT`` without and
  with sequence parallelism.
- ``single``: the unsplit model on each rank (what one device would do; no communication).
The head is untied because PyTorch's plans shard the embedding and the head separately (a tied
weight would be distributed twice).
"""
from __future__ import annotations

import argparse
import statistics
import types

import zero_ref

CFG = dict(vocab_size=1024, seq_len=64, d_model=256, n_heads=4, n_layers=4, tie_embeddings=False)
BIG = dict(vocab_size=8192, seq_len=128, d_model=1024, n_heads=16, n_layers=4, tie_embeddings=False)
LR, MICRO = 1e-3, 4


def _local_heads_forward(self, x):
    """CausalSelfAttention.forward on this rank's heads (the QKV output is [.., 3·h/t])."""
    import math

    import torch
    B, T, _ = x.shape
    qkv = self.qkv(x)
    c = qkv.shape[-1] // 3
    hd = c // self.local_heads
    q, k, v = (u.view(B, T, self.local_heads, hd).transpose(1, 2) for u in qkv.split(c, dim=2))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + self.causal_mask[:T, :T]
    y = torch.softmax(att, dim=-1) @ v
    return self.proj(y.transpose(1, 2).contiguous().view(B, T, c))


def torch_tp(model, tp):
    """PyTorch's tensor parallelism on the course GPT; returns step(idx, targets)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                                   parallelize_module)

    mesh = init_device_mesh("cpu", (tp,))
    c = model.cfg.d_model
    order = torch.cat([torch.arange(j * c + r * c // tp, j * c + (r + 1) * c // tp)
                       for r in range(tp) for j in range(3)])  # [Q_r, K_r, V_r] for each rank r
    for block in model.blocks:
        with torch.no_grad():
            block.attn.qkv.weight.copy_(block.attn.qkv.weight[order])
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[order])
        block.attn.local_heads = block.attn.n_heads // tp
        block.attn.forward = types.MethodType(_local_heads_forward, block.attn)
        parallelize_module(block, mesh, {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                                         "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
    parallelize_module(model, mesh, {
        "tok_emb": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})  # vocab-sharded logits
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)

    def step(idx, tgt):
        with loss_parallel():  # cross-entropy on vocab-sharded logits, as ours
            _, loss = model(idx, tgt)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.full_tensor().item() if hasattr(loss, "full_tensor") else loss.item()
    return step


def ours(model, sequence_parallel):
    import torch
    import torch.distributed as dist

    from zero_ref.parallel.tensor import TensorParallelGPT, sync_sequence_parallel_grads
    tp = TensorParallelGPT(model, dist.group.WORLD, sequence_parallel=sequence_parallel)
    opt = torch.optim.AdamW(tp.parameters(), lr=LR, weight_decay=0.0)

    def step(idx, tgt):
        _, loss = tp(idx, tgt)
        loss.backward()
        if sequence_parallel:
            sync_sequence_parallel_grads(tp, dist.group.WORLD)
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.item()
    return step


def single(model):
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)

    def step(idx, tgt):
        _, loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.item()
    return step


def bench(rank, tp, steps, warmup, big=False):
    import time

    import torch
    import torch.distributed as dist

    from zero_ref.models import GPT, GPTConfig, make_batch

    cfg = GPTConfig(**(BIG if big else CFG))
    batches = [make_batch(cfg, MICRO, seed=s) for s in range(steps + warmup)]  # the same batch on every tp rank
    makers = {"single": single, "torch_tp": lambda m: torch_tp(m, tp),
              "zero_ref_tp": lambda m: ours(m, False), "zero_ref_sp": lambda m: ours(m, True)}
    steppers = {}
    for name, make in makers.items():
        torch.manual_seed(0)
        steppers[name] = make(GPT(cfg))
    times = {name: [] for name in makers}
    losses = {name: [] for name in makers}
    names = list(makers)
    for i, (idx, tgt) in enumerate(batches):
        for name in (names if i % 2 else names[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            losses[name].append(steppers[name](idx, tgt))
            times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(times[name][warmup:]) * 1e3, losses[name][-1]) for name in names}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--big", action="store_true", help="the ≈67M-parameter model")
    args = ap.parse_args(argv)
    res = zero_ref.launch(bench, args.tp, args.steps, args.warmup, args.big, timeout=1800, echo=False)
    rows = {name: (statistics.median(r[name][0] for r in res), res[0][name][1]) for name in res[0]}
    base = rows["torch_tp"][0]
    from zero_ref.models import GPTConfig
    print(f"\n{GPTConfig(**(BIG if args.big else CFG)).num_params() / 1e6:.1f}M parameters, tp = {args.tp} ranks (median ms/step over ranks and {args.steps} steps, frameworks interleaved; "
          f"loss after the last step: all runs start from the same weights and see the same batches)")
    print(f"{'framework':<14}{'ms/step':>9}{'speed vs torch TP':>19}{'last loss':>11}")
    for name, (ms, loss) in rows.items():
        print(f"{name:<14}{ms:>9.1f}{base / ms:>18.2f}×{loss:>11.5f}")


if __name__ == "__main__":
    main()
