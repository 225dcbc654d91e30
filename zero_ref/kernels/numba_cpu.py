"""Fused Adam(W) on the CPU with Numba: one pass over parameters, gradients and both moments.

Three kernels share one loop body, ``adam_chunk``:

- ``adam_chunk`` steps four equal-length fp32 arrays (a chunk). It is a plain serial loop, and
  LLVM vectorizes it (AVX2 / AVX-512) because ``error_model="numpy"`` removes the Python
  division-by-zero check that would otherwise branch out of every iteration, and because it
  counts from 0: a loop over ``range(lo, hi)`` would keep Python's negative-index wraparound
  check in every access and run ~6x slower. Callers pass slices ``p[lo:hi]`` instead.
- ``adam_flat`` steps one flat partition (what a ZeRO rank owns): ``prange`` over chunks of
  ``CHUNK`` elements, each chunk one call of ``adam_chunk``. (Writing the body straight into the
  ``prange`` loop compiles, but Numba's parfor lowering then keeps it scalar: 5-7x slower.)
- ``adam_multi`` steps many tensors in **one call**: it receives a table of addresses and sizes
  (like a CUDA multi-tensor launch), cuts every tensor into chunks and runs all chunks of all
  tensors in one ``prange``: one thread-pool dispatch instead of one per tensor.

The moments follow torch's CPU AdamW operation for operation, including where torch's vectorized
kernels use a fused multiply-add (``lerp_``, ``addcmul_``, ``add(alpha=)``), so AdamW's moments
equal ``torch.optim.AdamW``'s bit for bit. The denominator is DeepSpeed's,
``fma(sqrt(v), 1 / sqrt(1 - beta2^t), eps)``: one division per element instead of two (see
``AdamConstants``). ``fastmath=False``: IEEE division and square root, no reassociation, no
approximate reciprocals.

``stream_adam_pattern`` does Adam's memory traffic (4 reads + 3 writes per element) with one
add per stored value and no other math: the bandwidth ceiling that a memory-bound Adam can
reach on this machine, measured with the same loop structure.
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

CHUNK = 65536  # elements per parallel task: 256 KiB of each stream (16K measured 2-3 % slower at 16M)

_JIT = dict(fastmath=False, error_model="numpy", cache=True)


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c with a single rounding (LLVM's llvm.fma; one vfmadd instruction)."""
    if not (a == b == c and isinstance(a, types.Float)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


@intrinsic
def _f32_pointer(typingctx, address):
    """An int64 address (``tensor.data_ptr()``) as a float32 pointer, for ``nb.carray``."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float32)))

    return types.CPointer(types.float32)(address), codegen


@njit(**_JIT)
def adam_chunk(p, g, m, v, decay, l2, w1, b2, w2, inv_bc2_sqrt, eps, neg_step_size):
    """Adam(W) in place on four equal-length fp32 arrays; constants from ``AdamConstants``."""
    for i in range(p.size):  # from 0: indices known non-negative, no wraparound check, vectorizes
        gi = g[i]
        if l2 != 0:                      # Adam: L2 penalty in the gradient, grad.add(param, alpha=wd)
            gi = fma(l2, p[i], gi)
        pi = p[i] * decay                # AdamW: decoupled decay, param.mul_(1 - lr * wd); 1 for Adam
        d = gi - m[i]                    # exp_avg.lerp_(grad, w1), w1 = 1 - beta1
        mi = fma(w1, d, m[i]) if w1 < 0.5 else fma(w1 - np.float32(1), d, gi)
        vi = fma(w2 * gi, gi, b2 * v[i])  # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=w2)
        denom = fma(math.sqrt(vi), inv_bc2_sqrt, eps)  # DeepSpeed: one division, not two
        p[i] = pi + (neg_step_size * mi) / denom   # param.addcdiv_(exp_avg, denom, value=-step_size)
        m[i] = mi
        v[i] = vi


@njit(parallel=True, **_JIT)
def adam_flat(p, g, m, v, decay, l2, w1, b2, w2, inv_bc2_sqrt, eps, neg_step_size):
    """Adam(W) on one flat fp32 partition: chunks of CHUNK elements, in parallel."""
    n = p.size
    for c in prange((n + CHUNK - 1) // CHUNK):
        lo, hi = c * CHUNK, min(n, (c + 1) * CHUNK)
        adam_chunk(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], decay, l2, w1, b2, w2, inv_bc2_sqrt, eps, neg_step_size)


@njit(**_JIT)
def _chunk_list(sizes):
    """(tensor index, first element) of every CHUNK-sized piece of every tensor."""
    count = 0
    for n in sizes:
        count += (n + CHUNK - 1) // CHUNK
    tensor = np.empty(count, np.int64)
    start = np.empty(count, np.int64)
    k = 0
    for t in range(sizes.size):
        for s in range(0, sizes[t], CHUNK):
            tensor[k] = t
            start[k] = s
            k += 1
    return tensor, start


@njit(parallel=True, **_JIT)
def adam_multi(addresses, sizes, decay, l2, w1, b2, w2, inv_bc2_sqrt, eps, neg_step_size):
    """Adam(W) on many fp32 tensors in one call.

    ``addresses[t]`` holds the data pointers of tensor t's param, grad, exp_avg and exp_avg_sq;
    ``sizes[t]`` its number of elements. All chunks of all tensors share one ``prange``.
    """
    tensor, start = _chunk_list(sizes)
    for c in prange(tensor.size):
        t = tensor[c]
        n = sizes[t]
        p = nb.carray(_f32_pointer(addresses[t, 0]), n)
        g = nb.carray(_f32_pointer(addresses[t, 1]), n)
        m = nb.carray(_f32_pointer(addresses[t, 2]), n)
        v = nb.carray(_f32_pointer(addresses[t, 3]), n)
        lo, hi = start[c], min(n, start[c] + CHUNK)
        adam_chunk(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], decay, l2, w1, b2, w2, inv_bc2_sqrt, eps, neg_step_size)


@njit(**_JIT)
def _stream_chunk(p, g, m, v):
    for i in range(p.size):
        gi = g[i]
        p[i] = p[i] + gi
        m[i] = m[i] + gi
        v[i] = v[i] + gi


@njit(parallel=True, **_JIT)
def stream_adam_pattern(p, g, m, v):
    """Adam's memory traffic without its math: read p, g, m, v; write p, m, v (one add each)."""
    n = p.size
    for c in prange((n + CHUNK - 1) // CHUNK):
        lo, hi = c * CHUNK, min(n, (c + 1) * CHUNK)
        _stream_chunk(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi])


def step_flat(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, k) -> None:
    """``adam_flat`` with the constants ``k`` (an ``AdamConstants``) cast to fp32."""
    adam_flat(p, g, m, v, *np.array(k, dtype=np.float32))


def step_multi(addresses: np.ndarray, sizes: np.ndarray, k) -> None:
    """``adam_multi`` with the constants ``k`` cast to fp32."""
    adam_multi(addresses, sizes, *np.array(k, dtype=np.float32))
