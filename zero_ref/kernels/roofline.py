"""The roofline of an Adam step: bytes moved and flops per parameter (arithmetic only; note that
importing it through ``zero_ref.kernels`` loads torch, which the package's kernels need).

A fused Adam step reads each parameter's fp32 master, gradient and both moments once and writes
the master and both moments once: 16 + 12 = **28 bytes per fp32 parameter**. It does 14
floating-point operations on them (AdamW), so its arithmetic intensity is 14 / 28 = 0.5 flop/byte —
far left of any CPU's or GPU's ridge point (several to tens of flop/byte): the step is
memory-bound, and its best possible time is bytes / bandwidth.
"""
from __future__ import annotations

from typing import NamedTuple

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# Floating-point operations per parameter in the fused kernel body (numba_cpu.adam_chunk),
# a fused multiply-add counted as 2: AdamW 14, Adam with L2 15.
ADAM_FLOPS = {
    # op:                           AdamW  Adam-L2
    "weight decay":                 (1,    2),   # p * decay  |  fma(wd, p, g)
    "first moment (lerp)":          (3,    3),   # g - m, fma(w1, d, m)
    "second moment":                (4,    4),   # w2 * g, b2 * v, fma(., g, .)
    "denominator":                  (3,    3),   # sqrt(v), / sqrt(bias correction 2), + eps
    "update":                       (3,    3),   # (-step_size * m) / denom, + p
}


def adam_flops_per_param(adamw: bool = True) -> int:
    """Flops per parameter of one fused Adam(W) step (an FMA counts 2)."""
    return sum(ops[0 if adamw else 1] for ops in ADAM_FLOPS.values())


class AdamTraffic(NamedTuple):
    """Bytes per parameter that one fused Adam step reads and writes."""

    reads: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.writes


def adam_traffic(grads: str = "fp32", params16: str | None = None) -> AdamTraffic:
    """Bytes per parameter of a fused step: fp32 master, exp_avg, exp_avg_sq read and written,
    the gradient (``grads`` dtype) read, and, with ``params16``, a 16-bit copy of the updated
    parameter written in the same pass."""
    for name, dt in (("grads", grads), ("params16", params16 or "fp32")):
        if dt not in DTYPE_BYTES:
            raise ValueError(f"{name} dtype {dt!r} is not one of {', '.join(DTYPE_BYTES)}")
    if params16 == "fp32":
        raise ValueError("params16 is the 16-bit copy: 'bf16' or 'fp16' (None for pure fp32)")
    reads = 4 + DTYPE_BYTES[grads] + 4 + 4
    writes = 4 + 4 + 4 + (DTYPE_BYTES[params16] if params16 else 0)
    return AdamTraffic(reads, writes)


def adam_bytes_per_param(grads: str = "fp32", params16: str | None = None) -> int:
    """28 for fp32; 28 for bf16 grads + a bf16 param copy; 30 for fp32 grads + a 16-bit copy."""
    return adam_traffic(grads, params16).total


# torch's unfused AdamW (the for-loop and foreach implementations): every op streams its full
# operands through memory. (op, fp32 tensors read, fp32 tensors written) per parameter.
UNFUSED_TORCH_ADAMW = (
    ("param.mul_(1 - lr * wd)", 1, 1),
    ("exp_avg.lerp_(grad, 1 - beta1)", 2, 1),
    ("exp_avg_sq.mul_(beta2)", 1, 1),
    ("exp_avg_sq.addcmul_(grad, grad, 1 - beta2)", 3, 1),
    ("exp_avg_sq.sqrt()", 1, 1),
    ("/ sqrt(bias_correction2)", 1, 1),
    (".add_(eps)", 1, 1),
    ("param.addcdiv_(exp_avg, denom, -step_size)", 3, 1),
)


def unfused_adam_bytes_per_param() -> int:
    """Bytes per fp32 parameter that the op-by-op AdamW moves: 4 × (reads + writes) of every op."""
    return sum(4 * (r + w) for _, r, w in UNFUSED_TORCH_ADAMW)


def time_bound_s(n_params: int, bandwidth_gbs: float, bytes_per_param: int = 28) -> float:
    """The fastest a memory-bound step on ``n_params`` can be at ``bandwidth_gbs`` GB/s."""
    return n_params * bytes_per_param / (bandwidth_gbs * 1e9)


def attainable_gflops(intensity: float, bandwidth_gbs: float, peak_gflops: float) -> float:
    """The roofline: min(peak compute, intensity × bandwidth)."""
    return min(peak_gflops, intensity * bandwidth_gbs)
