"""Fused Adam step time against PyTorch, DeepSpeed and the machine's memory bandwidth, in one run.

    python benchmarks/adam_kernels.py [--sizes 1M 16M 64M] [--tensors 1 100] [--repeats 15] [--threads 2]
    python benchmarks/adam_kernels.py --gpu    # on a CUDA machine: the extension and numba.cuda

CPU, fp32, AdamW: zero_ref's Numba kernel (``numba``: an ``AdamTensors`` built once, one call per
step; ``numba adam_step()``: the convenience call that validates its arguments every step)
against ``torch.optim.AdamW`` (foreach and fused) and DeepSpeed's ``DeepSpeedCPUAdam``, for one
tensor and for the same parameters split into 100 tensors. Each configuration also times
``numba_cpu.stream_adam_pattern``: Adam's exact memory accesses (read p, g, m, v; write p, m, v)
with one add per store and no other math, on flat arrays of the same total size — the bandwidth
ceiling for this access pattern, measured in the same run. All candidates of a configuration are
interleaved in a fresh random order every round, each turn a burst of ``--burst`` steps: the first step of a burst finds
the caches as the other candidates left them (*cold*), the following ones find the candidate's
own data still cached if it fits (*warm*; at 1M parameters the 16 MB of state fits the 32 MB L3,
at 16M it does not). The table shows medians, warm unless marked cold. GB/s is *effective*:
28 bytes per parameter over the step time.

On a GPU (``--gpu``): the CUDA extension, the numba.cuda kernel and torch's foreach / fused
AdamW, as a fraction of the device-to-device copy bandwidth (``Tensor.copy_`` of 1 GiB).
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from zero_ref.kernels import bench  # noqa: E402

DEFAULT_METHODS = ("numba", "numba adam_step()", "torch foreach", "torch fused", "deepspeed")


def parse_size(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * scale[text[-1].upper()]) if text[-1].upper() in scale else int(text)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def label(n: int) -> str:
    return f"{n >> 20}M" if n % (1 << 20) == 0 else f"{n:,}"


def cpu_run(args) -> int:
    import numba

    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    from zero_ref.kernels import numba_cpu

    numba_cpu.stream_adam_pattern(*[torch.zeros(4).numpy() for _ in range(4)])  # start numba's thread pool
    print(f"# CPU: {cpu_name()}, {os.cpu_count()} cores; {args.threads} threads (torch, DeepSpeed: torch's OpenMP; "
          f"numba {numba.__version__}: threading layer {numba.threading_layer()}); torch {torch.__version__}")
    print(f"# command: python benchmarks/{os.path.basename(__file__)} {' '.join(sys.argv[1:])}")
    print(f"# load average at start: {load()}")
    summary = {}
    for n in args.sizes:
        for t in args.tensors:
            results, skipped = bench.measure_cpu(n, t, methods=args.methods, repeats=args.repeats, burst=args.burst)
            by = {r.method: r for r in results}
            stream = by.pop(bench.STREAM)
            peers = [by[m] for m in ("torch fused", "deepspeed") if m in by]
            best = min(peers, key=lambda r: r.median_s) if peers else None
            best_cold = min(peers, key=lambda r: r.cold_median_s) if peers else None
            print(f"\n## {label(n)} parameters in {t} tensor{'s' if t > 1 else ''} "
                  f"(stream {stream.gbs:.1f} GB/s = {stream.gparams_per_s:.2f} Gparam/s; load {load()})")
            print("| method | ms/step | Gparam/s | GB/s | × stream | vs faster of torch fused, DeepSpeed "
                  "| ms/step cold | vs faster, cold |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            for r in sorted(by.values(), key=lambda r: r.median_s):
                vs = f"{best.median_s / r.median_s:.2f}×" if best else ""
                vs_cold = f"{best_cold.cold_median_s / r.cold_median_s:.2f}×" if best_cold else ""
                print(f"| {r.method} | {r.median_s * 1e3:.3f} | {r.gparams_per_s:.2f} | {r.gbs:.1f} | "
                      f"{r.gbs / stream.gbs:.2f} | {vs} | {r.cold_median_s * 1e3:.3f} | {vs_cold} |")
            print(f"| *stream (4 reads + 3 writes, no math)* | {stream.median_s * 1e3:.3f} | "
                  f"{stream.gparams_per_s:.2f} | {stream.gbs:.1f} | 1.00 | | {stream.cold_median_s * 1e3:.3f} | |")
            for m, why in skipped.items():
                print(f"| {m} | skipped: {why} | | | | | | |")
            summary[(n, t)] = (by, stream, best, best_cold)
            del results
            gc.collect()
    print(f"\n# load average at end: {load()}")
    return report_targets(summary)


def report_targets(summary) -> int:
    """The issue's targets, each PASS or MISS with its number (warm medians; cold in brackets)."""
    print("\n## Targets (numba = the one-call kernel on an AdamTensors; warm medians, cold in brackets)")
    for (n, t), (by, stream, best, best_cold) in summary.items():
        if "numba" not in by:
            continue
        r = by["numba"]
        if n >= 16 << 20:
            frac = r.gbs / stream.gbs
            frac_cold = stream.cold_median_s / r.cold_median_s
            print(f"- {'PASS' if frac >= 0.95 else 'MISS'} {label(n)} × {t}: numba at {frac:.2f}× the stream "
                  f"bandwidth [{frac_cold:.2f}×] (≥ 0.95)")
        if best:
            ratio, ratio_cold = best.median_s / r.median_s, best_cold.cold_median_s / r.cold_median_s
            print(f"- {'PASS' if ratio >= 1 else 'MISS'} {label(n)} × {t}: numba {ratio:.2f}× the faster of torch "
                  f"fused and DeepSpeedCPUAdam ({best.method}) [{ratio_cold:.2f}×] (≥ 1)")
        if n == 1 << 20 and t == 100 and "torch fused" in by:
            fused = by["torch fused"]
            speedup, cold = fused.median_s / r.median_s, fused.cold_median_s / r.cold_median_s
            print(f"- {'PASS' if speedup >= 4 else 'MISS'} 1M × 100: numba {speedup:.1f}× torch fused [{cold:.1f}×] (≥ 4)")
    return 0


def gpu_run(args) -> int:
    if not torch.cuda.is_available():
        print("# --gpu: no CUDA device here; skipped (the CPU table is the default run)")
        return 0
    print(f"# GPU: {torch.cuda.get_device_name()}; torch {torch.__version__} CUDA {torch.version.cuda}")
    copy = bench.gpu_copy_bandwidth()
    print(f"# device-to-device copy bandwidth: {copy:.0f} GB/s (read + write of 1 GiB, median)")
    for n in args.sizes:
        for t in args.tensors:
            results, skipped = bench.measure_gpu(n, t, repeats=args.repeats)  # bursts of 1: all calls count
            print(f"\n## GPU, {label(n)} parameters in {t} tensor{'s' if t > 1 else ''}")
            print("| method | ms/step | Gparam/s | GB/s | × copy bandwidth |")
            print("|---|---:|---:|---:|---:|")
            for r in sorted(results, key=lambda r: r.median_s):
                print(f"| {r.method} | {r.median_s * 1e3:.4f} | {r.gparams_per_s:.1f} | {r.gbs:.0f} | {r.gbs / copy:.2f} |")
            for m, why in skipped.items():
                print(f"| {m} | skipped: {why} | | | |")
            del results
            gc.collect()
            torch.cuda.empty_cache()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=parse_size, default=[1 << 20, 16 << 20, 64 << 20])
    ap.add_argument("--tensors", nargs="+", type=int, default=[1, 100])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--burst", type=int, default=3, help="steps in a row per turn: the first is cold, the rest warm")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=bench.CPU_METHODS)
    ap.add_argument("--gpu", action="store_true", help="benchmark the GPU kernels instead (needs CUDA)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rc = gpu_run(args) if args.gpu else cpu_run(args)
    print(f"# wall time {time.perf_counter() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
