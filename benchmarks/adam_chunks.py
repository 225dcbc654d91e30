"""The torch-arithmetic Adam step (``zero_ref.optim.adam_step_``) at each chunk size, against torch's AdamW.

    python benchmarks/adam_chunks.py [--numel 3440000] [--repeats 15]

One thread, fp32. ``adam_step_`` runs a long buffer in chunks of ``zero_ref.optim.CHUNK`` elements; each
chunk's seven element-wise operations allocate two chunk-sized temporaries. For each chunk size: the median
``step()`` of stage 0 training the course GPT (3.44M parameters) on one gloo rank, each size in a fresh
process (what the allocator does with a temporary depends on what the process allocated before), and
``adam_step_`` alone on one flat tensor of ``--numel`` elements; then that every size gives the same bits,
and ``torch.optim.AdamW`` (for-loop, foreach, fused) on the same tensor for scale.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import zero_ref
import zero_ref.optim as optim

CHUNKS = (1 << 22, 1 << 20, 1 << 18, 1 << 16, 1 << 14)


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def stage0_step_ms(rank, world, chunk: int, repeats: int) -> float:
    """Median ms of stage 0's ``step()`` on the course GPT, with ``CHUNK = chunk``."""
    from zero_ref.models import GPT, GPTConfig, make_batch
    from zero_ref.stages import STAGES
    torch.set_num_threads(1)
    optim.CHUNK = chunk
    cfg = GPTConfig(vocab_size=1024, seq_len=64, d_model=256, n_heads=4, n_layers=4)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = STAGES[0](model, adam=optim.AdamConfig(lr=1e-3, weight_decay=0.0))
    times = []
    for s in range(repeats + 3):
        _, loss = model(*make_batch(cfg, 4, seed=s))
        opt.backward(loss)
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:]) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=3_440_000)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = optim.AdamConfig(lr=1e-3, weight_decay=0.0)
    start = [torch.randn(args.numel) for _ in range(4)]
    start[3].abs_()
    default, results = optim.CHUNK, {}
    print(f"stage 0's step() on the course GPT, one rank, one thread (zero_ref.optim.CHUNK = {default:,})")
    for chunk in CHUNKS:
        ms = zero_ref.launch(stage0_step_ms, 1, chunk, args.repeats, timeout=300)[0]
        print(f"  chunks of 2^{chunk.bit_length() - 1:<2} {ms:7.2f} ms/step")
    print(f"adam_step_ on one tensor of {args.numel:,} elements, in this process")
    for chunk in CHUNKS:
        optim.CHUNK = chunk
        p, g, m, v = (t.clone() for t in start)
        state = {"step": 0}

        def step():
            state["step"] += 1
            optim.adam_step_(p, g, m, v, state["step"], cfg)
        print(f"  adam_step_, chunks of 2^{chunk.bit_length() - 1:<2} {median_ms(step, args.repeats):7.2f} ms/step")
        results[chunk] = (p, m, v)
    optim.CHUNK = default
    same = all(all(torch.equal(a, b) for a, b in zip(r, results[default])) for r in results.values())
    print(f"  every chunk size gives the same bits: {same}")
    for kw in ({"foreach": False}, {"foreach": True}, {"fused": True}):
        p = torch.nn.Parameter(start[0].clone())
        p.grad = start[1].clone()
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.0, **kw)
        label = ", ".join(f"{k}={v}" for k, v in kw.items())
        print(f"  torch.optim.AdamW({label}) {median_ms(opt.step, args.repeats):7.2f} ms/step")


if __name__ == "__main__":
    main()
