"""Symmetric block quantization (torch only), shared by ZeRO++'s qwZ (int8 weights) and qgZ (int4 gradients).

A flat tensor is cut into blocks; each block keeps one fp32 scale ``s = max|x| / q_max`` (q_max 127 for int8,
7 for int4) and the integers ``round(x / s)``, so every element comes back within ``s / 2``:
``|x − dequantize(quantize(x))| ≤ s/2``. int4 values travel two to a byte.

The block count follows DeepSpeed 0.19.8's ``CUDAQuantizer.quantize`` (runtime/zero/partition_parameters.py):
``ceil(numel / 8000)`` groups, raised until ``numel`` divides by ``8·groups``, then doubled while that still
divides and blocks stay over 8000 elements. DeepSpeed asserts ``numel % 8 == 0``; here the input is first
zero-padded to a multiple of 8 (the padding travels and is counted). DeepSpeed's kernel scales by
``max / 2^(bits−1)`` and clamps to ``[−2^(bits−1), 2^(bits−1)−1]`` (csrc/includes/quantization_utils.h,
``Params<Symmetric>``), so its largest element can be off by one whole step; dividing by q_max keeps every
element within half a step.
"""
from __future__ import annotations

import functools
import math

import torch

TARGET_BLOCK = 8000  # DeepSpeed's CUDAQuantizer.target_group_size


def padded(numel: int, block: int | None = None) -> int:
    """``numel`` rounded up to a multiple of 8, or of ``block`` if given (what is quantized and sent)."""
    step = block or 8
    return -(-numel // step) * step


def block_count(numel: int, block: int | None = None) -> int:
    """DeepSpeed's qwZ group count for a tensor of ``numel`` elements (a multiple of 8); with ``block``, numel/block."""
    if block:
        return numel // block
    if numel <= 0 or numel % 8:
        raise ValueError(f"block_count: numel must be a positive multiple of 8, got {numel} (pad it: padded())")
    groups = _least_divisor_from(numel // 8, math.ceil(numel / TARGET_BLOCK))  # DeepSpeed counts up to it
    while numel % (16 * groups) == 0 and numel / groups > TARGET_BLOCK:
        groups *= 2
    return groups


def q_max(bits: int) -> int:
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    return (1 << (bits - 1)) - 1


@functools.lru_cache(maxsize=65536)
def _least_divisor_from(k: int, start: int) -> int:
    """The least divisor of ``k`` that is ≥ ``start`` (k itself at most): DeepSpeed's ``groups += 1`` loop,
    through the divisors below √k instead of up to k/8 steps (the planner counts blocks of whole layers)."""
    small = [d for d in range(1, math.isqrt(k) + 1) if k % d == 0]
    return min(d for d in small + [k // d for d in small] if d >= start) if start <= k else start


def quantized_bytes(numel: int, bits: int, rows: int = 1, block: int | None = None) -> int:
    """Bytes of ``quantize``'s output for ``rows`` rows of ``numel`` elements each: integers + fp32 scales."""
    n = padded(numel, block)
    return rows * (n * bits // 8 + 4 * block_count(n, block))


def quantize(x: torch.Tensor, bits: int = 8, rows: int = 1,
             block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (``rows`` equal rows end to end, each zero-padded to a multiple of 8 and cut into DeepSpeed's
    blocks; or padded to a multiple of ``block`` and cut into blocks of that size)
    → (integers: int8, or uint8 holding two int4; fp32 scales, one per block)."""
    qm = q_max(bits)
    x = x.detach().reshape(rows, -1).float()
    n = padded(x.shape[1], block)
    if n != x.shape[1]:
        x = torch.nn.functional.pad(x, (0, n - x.shape[1]))
    blocks = x.reshape(rows * block_count(n, block), -1)
    scales = blocks.abs().amax(dim=1) / qm
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero block: any scale is exact
    q = torch.round(blocks / scales[:, None]).clamp_(-qm, qm).to(torch.int8).reshape(-1)
    if bits == 4:
        q = q.reshape(-1, 2)
        q = ((q[:, 0] & 0xF) | (q[:, 1] << 4)).to(torch.uint8)  # low nibble first
    return q, scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, numel: int, bits: int = 8, rows: int = 1,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of ``quantize``: ``rows`` rows of ``numel`` elements (padding dropped), in ``dtype``."""
    if bits == 4:
        b = q.view(torch.uint8).to(torch.int16)
        lo, hi = b & 0xF, b >> 4
        q = torch.stack((lo - ((lo & 8) << 1), hi - ((hi & 8) << 1)), dim=1).reshape(-1)  # sign-extend nibbles
    values = q.float().reshape(scales.numel(), -1) * scales[:, None]
    return values.reshape(rows, -1)[:, :numel].to(dtype).reshape(-1)
