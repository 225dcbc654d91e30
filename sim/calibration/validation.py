"""The simulator against every published run: calibrate, predict the held-out rows, print the table.

    python -m sim.calibration.validation            # the table of benchmarks/README.md ("Published throughput")

``report()`` fits the constants on ``sim.calibration.calibrate.CALIBRATION`` (one row per constant), predicts
every other row of sim.calibration.published and returns the table: per row the published and simulated step
time and TFLOP/s per GPU (the paper's own FLOPs count) and the errors, then the mean absolute
error over the held-out rows, overall and per family — 'megatron' (tensor × pipeline parallel,
Megatron-LM and Megatron-DeepSpeed), 'zero3' (ZeRO-3 data parallelism) and 'offload' (ZeRO with
the optimizer on the CPU) — then the H100 section ('h100': Llama 3 405B and Nemotron-4 15B;
'fsdp': llm-foundry's and torchtitan's FSDP tables; the H100 GEMM efficiency, FlashAttention's
efficiency and eager element-wise traffic fitted on one row each, the others held out) and the
same rows with the A100's GEMM efficiency in its place (``h100_table``). Each fitted row is printed
with its source and configuration. ``before()`` is the same with the cost model as it was before the
ZeRO-3 and V100 constants existed (two constants, prefetched backward gathers), for comparison.
"""
from __future__ import annotations

from statistics import fmean

from sim.calibration import calibrate
from sim.calibration.published import FAMILIES, get
from sim.step import lowering


def family_mape(validation, family: str) -> float:
    """Mean absolute time error of ``validation``'s rows of one family (nan if it has none)."""
    errs = [abs(r.time_error) for r in validation.rows if get(r.name).family == family]
    return fmean(errs) if errs else float("nan")


def table(validation, fit=None, families=FAMILIES) -> str:
    """Per-row lines (calibration rows first, marked) and the MAPE lines, overall and per family."""
    lines = [f"{'run':38s} {'family':8s} {'time s':>8s} {'sim s':>8s} {'err':>7s} {'TFLOP/s':>8s} {'sim':>7s}"
             f" {'err':>7s}"]
    for r in validation.rows:
        mark = " (fit)" if fit is not None and r.name in fit.rows else ""
        lines.append(f"{r.name + mark:38s} {get(r.name).family:8s} {r.measured_time:8.2f} {r.predicted_time:8.2f} "
                     f"{r.time_error:+7.1%} {r.measured_tflops:8.1f} {r.predicted_tflops:7.1f} {r.tflops_error:+7.1%}")
    held = calibrate.Validation(validation.costs, [r for r in validation.rows
                                                   if fit is None or r.name not in fit.rows])
    lines.append(f"held-out MAPE over {len(held.rows)} rows: time {held.mape_time:.1%}, TFLOP/s per GPU "
                 f"{held.mape_tflops:.1%}; by family: " + ", ".join(
                     f"{f} {family_mape(held, f):.1%} ({sum(get(r.name).family == f for r in held.rows)} rows)"
                     for f in families))
    return "\n".join(lines)


HOPPER_FAMILIES = ("h100", "fsdp", "fp8")


def config(run) -> str:
    """A published run's configuration in one line."""
    return (f"{run.gpus} × {run.gpu}, TP {run.tp} PP {run.pp}" + (f" CP {run.cp}" if run.cp > 1 else "") + f" DP {run.dp}"
            + (f" VP {run.virtual}" if run.virtual > 1 else "")
            + f", micro-batch {run.micro_batch} × {run.num_microbatches}, global batch {run.global_batch}, "
            f"sequence {run.seq}, recompute {run.recompute}, {run.precision}" + (" with FP8 GEMMs" if run.fp8 else "")
            + f", ZeRO {run.zero_stage}"
            + (f", {run.framework}" + ("" if run.reshard_after_forward else " (no reshard after forward)")
               if run.framework else "") + f", {run.attention} attention, {run.kernels} kernels")


def hopper_rows(fit) -> list:
    """The H100 rows (families 'h100' and 'fsdp'): the fitted ones first, then the held-out."""
    rows = [r for r in (get(n) for n in fit.rows) if r.family in HOPPER_FAMILIES]
    return rows + [r for r in calibrate.held_out(fit.rows) if r.family in HOPPER_FAMILIES]


def h100_table(fit) -> str:
    """The H100 rows with the fitted constants (fitted rows marked), then with the A100's GEMM efficiency."""
    rows = hopper_rows(fit)
    a100 = calibrate.with_params(fit.costs, {"h100": fit.values["efficiency"]})
    return (f"H100 (NVLink 4, 400 Gb/s per GPU; bf16 peak 989 TFLOP/s): h100 = {fit.values['h100']:.4f}, "
            f"attention = {fit.values['attention']:.4f}, eager = {fit.values['eager']:.4f}, fp8 = {fit.values['fp8']:.4f} "
            "fitted on the "
            "marked rows, the others held out\n"
            + table(calibrate.validate(fit.costs, rows), fit, HOPPER_FAMILIES)
            + f"\nthe same rows with the A100's GEMM efficiency ({fit.values['efficiency']:.4f}) on H100s:\n"
            + table(calibrate.validate(a100, rows), fit, HOPPER_FAMILIES))


def report() -> str:
    """Fit, predict every published row, and return the tables (see the module docstring)."""
    fit = calibrate.fit()
    rows = [get(n) for n in calibrate.CALIBRATION] + list(calibrate.held_out())
    head = ("calibrated on " + ", ".join(fit.rows) + ": "
            + ", ".join(f"{k} = {v:.4f}" for k, v in fit.values.items()))
    fitted = "\n".join(f"  fit row {r.name}: {config(r)}\n    {r.source}" for r in (get(n) for n in fit.rows))
    older = [r for r in rows if r.family not in HOPPER_FAMILIES]
    return (head + "\n" + fitted + "\nA100 and V100:\n"
            + table(calibrate.validate(fit.costs, older), fit, tuple(f for f in FAMILIES if f not in HOPPER_FAMILIES))
            + "\n" + h100_table(fit))


def before() -> str:
    """The table with the previous cost model: efficiency and bandwidth fitted on the two
    Korthikanti rows, ZeRO-3 collectives as fast as any other, backward gathers prefetched, one
    GEMM efficiency for every GPU."""
    saved = lowering.BACKWARD_GATHER
    lowering.BACKWARD_GATHER = "prefetch"
    try:
        fit = calibrate.fit(calibrate.CALIBRATION[:2], params=("efficiency", "bandwidth"))
        rows = [r for r in calibrate.held_out(fit.rows) if r.family not in HOPPER_FAMILIES]
        return table(calibrate.validate(fit.costs, rows), fit, tuple(f for f in FAMILIES if f not in HOPPER_FAMILIES))
    finally:
        lowering.BACKWARD_GATHER = saved


if __name__ == "__main__":
    print(report())
