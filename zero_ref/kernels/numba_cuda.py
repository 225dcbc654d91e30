"""Fused Adam(W) as a ``numba.cuda`` kernel: one thread per element, a grid-stride loop.

The body is the CPU kernel's (``numba_cpu.adam_chunk``), with ``cuda.fma`` for the fused
multiply-adds; with no GPU it runs under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``,
read when numba is first imported, so tests run it in a subprocess: ``simulate``), where CPU
tensors stand in for device arrays. On a GPU it takes CUDA tensors through
``__cuda_array_interface__`` (no copy) and launches on torch's current stream. Lists of tensors
are stepped one launch per tensor; the one-launch multi-tensor form is the CUDA extension's.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np

if not hasattr(np, "row_stack"):
    # some numba-cuda releases register an overload of np.row_stack at import; numpy 2.5 removed that alias
    np.row_stack = np.vstack
from numba import cuda  # noqa: E402

THREADS = 256          # threads per block on a GPU
SIM_THREADS = 32       # the simulator runs every thread as a Python thread: keep blocks small


def simulator_enabled() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


def unavailable_reason() -> str | None:
    """None when ``numba.cuda`` can run kernels here (a GPU, or the simulator), else why not."""
    if simulator_enabled():
        return None
    try:
        if cuda.is_available():
            return None
    except Exception as e:  # noqa: BLE001 - a broken driver is a reason, not a crash
        return f"numba.cuda found no usable GPU ({e})"
    return "no CUDA GPU (set NUMBA_ENABLE_CUDASIM=1 before numba is imported to run in the simulator)"


@cuda.jit(fastmath=False)
def adam_kernel(p, g, m, v, decay, l2, w1, b2, w2, inv_bc2_sqrt, eps, neg_step_size):
    """One Adam(W) step; thread i handles elements i, i + stride, i + 2 stride, ..."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, p.size, stride):
        gi = g[i]
        if l2 != 0:                      # Adam: L2 penalty in the gradient
            gi = cuda.fma(l2, p[i], gi)
        pi = p[i] * decay                # AdamW: decoupled decay
        d = gi - m[i]                    # exp_avg.lerp_(grad, w1)
        mi = cuda.fma(w1, d, m[i]) if w1 < 0.5 else cuda.fma(w1 - np.float32(1), d, gi)
        vi = cuda.fma(w2 * gi, gi, b2 * v[i])
        denom = cuda.fma(math.sqrt(vi), inv_bc2_sqrt, eps)
        p[i] = pi + (neg_step_size * mi) / denom
        m[i] = mi
        v[i] = vi


def launch_config(n: int) -> tuple[int, int]:
    """(blocks, threads per block) for n elements."""
    if simulator_enabled():
        return max(1, min(2, -(-n // SIM_THREADS))), SIM_THREADS
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    return max(1, min(-(-n // THREADS), 8 * sms)), THREADS


def step(tensors, k) -> None:
    """Step an ``AdamTensors`` (fp32) with constants ``k``, one launch per tensor."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"backend 'numba_cuda' cannot run: {reason}")
    kernel = adam_kernel
    consts = [np.float32(x) for x in k]
    if simulator_enabled():
        if tensors.device.type != "cpu":
            raise ValueError("under NUMBA_ENABLE_CUDASIM=1 backend 'numba_cuda' takes CPU tensors")
        for group in zip(tensors.params, tensors.grads, tensors.exp_avgs, tensors.exp_avg_sqs):
            blocks, threads = launch_config(group[0].numel())
            kernel[blocks, threads](*(t.detach().reshape(-1).numpy() for t in group), *consts)
        return
    if tensors.device.type != "cuda":
        raise ValueError(f"backend 'numba_cuda' needs CUDA tensors but they are on {tensors.device}")
    import torch

    stream = cuda.external_stream(torch.cuda.current_stream(tensors.device).cuda_stream)
    for group in zip(tensors.params, tensors.grads, tensors.exp_avgs, tensors.exp_avg_sqs):
        blocks, threads = launch_config(group[0].numel())
        arrays = [cuda.as_cuda_array(t.detach().reshape(-1)) for t in group]
        kernel[blocks, threads, stream](*arrays, *consts)


def simulate(sizes=(1, 7, 300), steps: int = 10, seed: int = 0, timeout: float = 120) -> dict:
    """Run the kernel under the CUDA simulator in a fresh process; compare with torch.optim.

    Returns ``{"adamw": err, "adam_l2": err, "sizes": ..., "steps": ...}`` where ``err`` is the
    largest ``max|p - p_ref| / max|p_ref|`` over the tensors after ``steps`` steps against
    ``torch.optim.AdamW`` (decoupled decay) and ``torch.optim.Adam`` (L2 decay). The simulator
    evaluates the body with NumPy and Python scalars (``math.sqrt`` in double, ``cuda.fma`` as a
    multiply and an add), so it checks the logic and the indexing, not the last bit.
    """
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    args = json.dumps({"sizes": list(sizes), "steps": steps, "seed": seed})
    out = subprocess.run([sys.executable, "-m", "zero_ref.kernels.check", args], env=env,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"the simulator run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
