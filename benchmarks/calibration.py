"""The simulator calibrated on real zero_ref steps on this machine: fitted constants, simulated vs measured.

    python benchmarks/calibration.py [--repeats 2] [--steps 6] [--world3]

Each repeat is one launch of 2 gloo ranks (one thread each) that measures the machine (GEMM rate,
memory bandwidth, the collective sweep) and times six configurations of the course GPT (3.44M
parameters, fp32) interleaved step by step. ``sim.calibration.fit_local`` fits its constants on ZeRO-1 at
micro-batch 4 alone and simulates every configuration; printed per clock (the step's CPU time, the
fastest step's wall clock): measured ms, simulated ms, error. ``--world3`` adds a launch of 3 ranks
(more ranks than this machine's 2 cores) predicted from the 2-rank fit.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sim.calibration.fit_local as fl  # noqa: E402
from zero_ref.profiling.profile import StepSpec, measure  # noqa: E402

SPECS = {"zero1": StepSpec(1, 4), "zero2 gas2": StepSpec(2, 4, gas=2), "zero0 mb8": StepSpec(0, 8),
         "zero1 gas2": StepSpec(1, 4, gas=2), "zero2 mb8": StepSpec(2, 8), "zero3": StepSpec(3, 4)}
WORLD3 = {"zero1": StepSpec(1, 4), "zero2 gas2": StepSpec(2, 4, gas=2)}


def report(measured: dict, world3: dict | None) -> dict:
    """Print the fit and the comparison on both clocks; return {clock: {name: error}}."""
    m = measured["machine"]
    link = fl.fit_alpha_beta(measured["sweep"])
    print(f"machine: {m['cores']} cores, per rank GEMM {m['gemm_flops'] / 1e9:.1f} GFLOP/s, memory "
          f"{m['memory_bw'] / 1e9:.1f} GB/s; link alpha {link.alpha * 1e6:.0f} us, {link.bandwidth / 1e9:.2f} GB/s")
    errors = {}
    for basis in fl.BASES:
        fit = fl.fit_local(measured, "zero1", basis=basis)
        rows = fl.compare(fit, measured)
        if world3 is not None:
            rows += [fl.Comparison(f"{name} x3", step[basis]["step"], fit.predict(step), False)
                     for name, step in world3["steps"].items()]
        print(f"\n{basis} clock; fitted on zero1: " + ", ".join(
            f"{k} {fit.values[k]:.3g}" for k in ("efficiency", "adam_bytes_per_param", "nvlink_efficiency")))
        print(fl.table(rows))
        errors[basis] = {r.name: r.error for r in rows}
    return errors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--world3", action="store_true", help="also measure 3 ranks and predict them from the 2-rank fit")
    args = ap.parse_args(argv)
    runs = []
    for rep in range(args.repeats):
        print(f"\n=== repeat {rep + 1} of {args.repeats}")
        measured = measure(SPECS, 2, steps=args.steps, warmup=2, timeout=1200)
        world3 = measure(WORLD3, 3, steps=args.steps, warmup=2, sweep_sizes=(), timeout=1200) if args.world3 else None
        runs.append(report(measured, world3))
    print(f"\nerror range over {args.repeats} repeats (simulated / measured - 1):")
    for basis in fl.BASES:
        for name in runs[0][basis]:
            values = [r[basis][name] for r in runs]
            print(f"  {basis:4s} {name:<14}{min(values):+7.1%} .. {max(values):+7.1%}")


if __name__ == "__main__":
    main()
