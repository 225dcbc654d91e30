"""Fused Adam(W) kernels: one pass over parameters, gradients and both moments, in place.

One API, four backends, one arithmetic (torch's AdamW / Adam-with-L2, DeepSpeed's semantics:
bias correction, decoupled or L2 weight decay)::

    from zero_ref.kernels import adam_step
    from zero_ref.optim import AdamConfig
    adam_step(params, grads, exp_avgs, exp_avg_sqs, step, AdamConfig(lr=1e-3), backend="numba")

=============  ==========================================================================
``torch``      the readable reference: ``zero_ref.optim.adam_step_`` per tensor (plain torch ops)
``numba``      Numba CPU: ``prange`` over chunks, one call for a flat partition or a list
``numba_cuda`` ``numba.cuda`` kernel; runs on CPU tensors under ``NUMBA_ENABLE_CUDASIM=1``
``cuda``       C++/CUDA extension (``torch.utils.cpp_extension``, built on first use): float4
               loads, one launch for many tensors, fp32 params or fp32 masters + a bf16/fp16 copy
=============  ==========================================================================

Each argument is one tensor or a list of tensors (same length, same shapes pairwise), fp32,
contiguous, all on one device. ``params16`` (optional, ``torch`` and ``cuda``) is a list of
bf16/fp16 tensors that receive the updated fp32 ``params`` rounded to 16 bits, and ``grads``
may then be in that 16-bit dtype too. To step the same tensors many times, build
``AdamTensors`` once (it validates and builds the multi-tensor table once) and call its ``step``.
``adam_update_`` is the step a ZeRO stage runs on its partition, with one of ``KERNELS`` (torch, numba, cuda).

``zero_ref.kernels.roofline`` has the byte counts and the bandwidth measurements.
"""
from __future__ import annotations

from importlib import import_module

from zero_ref.kernels.adam import (BACKENDS, KERNELS, AdamConfig, AdamConstants, AdamTensors, adam_step, adam_update_,
                                   available_backends)

__all__ = ["AdamConfig", "AdamConstants", "AdamTensors", "BACKENDS", "KERNELS", "adam_step", "adam_update_",
           "available_backends", "roofline", "numba_cpu", "numba_cuda", "cuda_ext"]


def __getattr__(name):
    if name in ("roofline", "numba_cpu", "numba_cuda", "cuda_ext"):
        return import_module(f"zero_ref.kernels.{name}")
    raise AttributeError(f"module 'zero_ref.kernels' has no attribute {name!r}")
