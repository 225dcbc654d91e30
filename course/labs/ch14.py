"""Chapter 14's harness: the multi-tensor Numba kernel behind a check of its table, and the host work of a step.

``GuardedKernel`` is what Task 14.2 calls as ``step_multi``: ``numba_cpu.step_multi`` after checking that every
address of the table is the start of a tensor it was given and every size fits that tensor (a wrong table would
make the kernel write over memory). ``versus_torch`` and ``host_calls_per_step`` grade a multi-tensor step built
once over persistent tensors, the way an optimizer holds them.
"""
import sys

import numpy as np
import torch

from zero_ref.kernels import numba_cpu
from zero_ref.optim import AdamConfig

COLUMNS = ("param", "grad", "exp_avg", "exp_avg_sq")


class GuardedKernel:
    """``numba_cpu.step_multi(addresses, sizes, k)`` that refuses a table outside the allowed tensors; counts calls."""

    def __init__(self):
        self.extent: dict[int, int] = {}
        self.calls = 0

    def allow(self, *lists) -> None:
        """The tensors a table may point to (fp32, contiguous)."""
        self.extent = {t.data_ptr(): t.numel() for ts in lists for t in ts}

    def __call__(self, addresses, sizes, k) -> None:
        profiler = sys.getprofile()
        sys.setprofile(None)  # the guard's own work is not the caller's host work
        try:
            self.calls += 1
            self._check(addresses, sizes)
            numba_cpu.step_multi(addresses, sizes, k)
        finally:
            sys.setprofile(profiler)

    def _check(self, addresses, sizes) -> None:
        for name, a, shape in (("addresses", addresses, (len(sizes), 4)), ("sizes", sizes, (len(addresses),))):
            if not isinstance(a, np.ndarray) or a.dtype != np.int64 or a.shape != shape:
                got = f"{type(a).__name__} {getattr(a, 'dtype', '')} {getattr(a, 'shape', '')}"
                raise TypeError(f"{name} must be an np.int64 array of shape {shape}, got {got}")
        for t, (row, n) in enumerate(zip(addresses.tolist(), sizes.tolist())):
            for column, address in zip(COLUMNS, row):
                if address not in self.extent:
                    raise ValueError(f"addresses[{t}] ({column}) = {address:#x} is not the data_ptr() of a tensor "
                                     "of the step")
                if not 0 < n <= self.extent[address]:
                    raise ValueError(f"sizes[{t}] = {n} but the {column} at addresses[{t}] holds "
                                     f"{self.extent[address]} elements (sizes count elements)")


def _tensors(sizes, seed):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(n, generator=gen) for n in sizes]
    return params, [torch.zeros(n) for n in sizes], [torch.zeros(n) for n in sizes], [torch.zeros(n) for n in sizes]


def versus_torch(make, kernel: GuardedKernel, sizes, steps=10, lr=1e-2, weight_decay=0.1, seed=0):
    """(max relative error of the parameters against ``torch.optim.AdamW``, kernel calls per step) after ``steps``
    steps of ``make(params, grads, exp_avgs, exp_avg_sqs)``, built once; each step's gradients are written into
    the same gradient tensors, as a training loop's backward does."""
    params, grads, ms, vs = _tensors(sizes, seed)
    kernel.allow(params, grads, ms, vs)
    ref = [p.clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(ref, lr=lr, weight_decay=weight_decay)
    cfg = AdamConfig(lr=lr, weight_decay=weight_decay)
    step_all = make(params, grads, ms, vs)
    gen = torch.Generator().manual_seed(seed + 1)
    kernel.calls = 0
    for step in range(1, steps + 1):
        for g, r in zip(grads, ref):
            g.copy_(torch.randn(g.numel(), generator=gen))
            r.grad = g.clone()
        opt.step()
        step_all(step, cfg)
    error = max(((p - r.detach()).abs().max() / r.detach().abs().max()).item() for p, r in zip(params, ref))
    return error, kernel.calls / steps


def host_calls_per_step(make, kernel: GuardedKernel, tensors: int, size: int = 64) -> int:
    """Python and C function calls one step of ``make(...)`` makes on ``tensors`` tensors (``sys.setprofile``),
    after a first step (which may build what it keeps)."""
    lists = _tensors([size] * tensors, seed=0)
    kernel.allow(*lists)
    step_all, cfg = make(*lists), AdamConfig()
    step_all(1, cfg)
    count = [0]

    def profile(frame, event, arg):
        if event in ("call", "c_call"):
            count[0] += 1

    sys.setprofile(profile)
    try:
        step_all(2, cfg)
    finally:
        sys.setprofile(None)
    return count[0]

