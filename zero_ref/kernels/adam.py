"""The fused Adam(W) step: validated tensors (``AdamTensors``), one call per backend (``adam_step``), and the
step a ZeRO stage runs on its partition (``adam_update_``). The package face ``zero_ref.kernels`` explains the
backends."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from zero_ref.optim import AdamConfig, adam_step_

BACKENDS = ("torch", "numba", "numba_cuda", "cuda")
KERNELS = ("torch", "numba", "cuda")  # the backends a ZeRO stage's optimizer step can run on its partition
HALF_DTYPES = (torch.bfloat16, torch.float16)


class AdamConstants(NamedTuple):
    """The per-step scalars of the fused kernels (computed in double, used in fp32, as torch does).

    The kernels update the moments with torch's operations (so AdamW's moments equal torch's bit
    for bit) and form the denominator as DeepSpeed's CPU Adam does,
    ``fma(sqrt(v), 1 / sqrt(1 - beta2^t), eps)``: one division per element instead of torch's
    two (``sqrt(v) / sqrt(bc2)`` and ``m / denom``). Divisions and square roots share one slow
    unit, and when the data sits in cache that unit is the bottleneck.
    """

    decay: float          # AdamW: 1 - lr * weight_decay; Adam: 1
    l2: float             # Adam: weight_decay (added to the gradient); AdamW: 0
    w1: float             # 1 - beta1, the weight of exp_avg.lerp_(grad, w1)
    b2: float             # beta2
    w2: float             # 1 - beta2
    inv_bc2_sqrt: float   # 1 / sqrt(1 - beta2^step)
    eps: float
    neg_step_size: float  # -lr / (1 - beta1^step)

    @classmethod
    def from_config(cls, step: int, cfg: AdamConfig) -> "AdamConstants":
        b1, b2 = cfg.betas
        return cls(decay=1 - cfg.lr * cfg.weight_decay if cfg.adamw else 1.0,
                   l2=0.0 if cfg.adamw else float(cfg.weight_decay),
                   w1=1 - b1, b2=b2, w2=1 - b2, inv_bc2_sqrt=1 / (1 - b2**step) ** 0.5, eps=cfg.eps,
                   neg_step_size=-(cfg.lr / (1 - b1**step)))


def _as_list(name: str, x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in x):
        return list(x)
    raise TypeError(f"{name} must be a tensor or a list of tensors, not {type(x).__name__}")


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


class AdamTensors:
    """Validated params / grads / exp_avgs / exp_avg_sqs (and optional 16-bit params16).

    Validation and the multi-tensor table happen once, here; ``step`` then costs one kernel call.
    The tensors are held by reference: their storage must not move between steps (assigning a
    new ``.grad`` tensor means building a new ``AdamTensors``).
    """

    def __init__(self, params, grads, exp_avgs, exp_avg_sqs, params16=None):
        single = isinstance(params, torch.Tensor)
        named = {"params": params, "grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs}
        if params16 is not None:
            named["params16"] = params16
        lists = {}
        for name, x in named.items():
            lists[name] = _as_list(name, x)
            if isinstance(x, torch.Tensor) != single:
                this = "a tensor" if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"
                raise TypeError(f"params is {'a tensor' if single else 'a list'} but {name} is {this}: "
                                "pass all tensors or all lists")
        n = len(lists["params"])
        if n == 0:
            raise ValueError("params is an empty list: nothing to step")
        for name, xs in lists.items():
            if len(xs) != n:
                raise ValueError(f"{name} has {len(xs)} tensors but params has {n}")
        self.params, self.grads = lists["params"], lists["grads"]
        self.exp_avgs, self.exp_avg_sqs = lists["exp_avgs"], lists["exp_avg_sqs"]
        self.params16 = lists.get("params16")
        self.device = self.params[0].device
        half = self.params16[0].dtype if self.params16 else None
        if half is not None and half not in HALF_DTYPES:
            raise TypeError(f"params16[0] has dtype {half}; params16 must be torch.bfloat16 or torch.float16")
        grad_dtypes = (torch.float32,) if half is None else (torch.float32, half)
        for name, xs in lists.items():
            for i, t in enumerate(xs):
                p = self.params[i]
                if name == "params16":
                    ok = t.dtype == half
                elif name == "grads":
                    ok = t.dtype in grad_dtypes
                else:
                    ok = t.dtype == torch.float32
                if not ok:
                    want = {"params16": str(half), "grads": " or ".join(map(str, grad_dtypes))}.get(name, "torch.float32")
                    hint = ("; the kernels step fp32 (master) parameters: pass the 16-bit copy as params16"
                            if name == "params" and t.dtype in HALF_DTYPES else "")
                    raise TypeError(f"{name}[{i}] has dtype {t.dtype}, expected {want}{hint}")
                if t.shape != p.shape:
                    raise ValueError(f"{name}[{i}] has shape {_shape(t)} where params[{i}] has {_shape(p)}")
                if t.device != self.device:
                    raise ValueError(f"{name}[{i}] is on {t.device} but params[0] is on {self.device}: "
                                     "all tensors must be on one device")
                if not t.is_contiguous():
                    raise ValueError(f"{name}[{i}] is not contiguous: the kernels walk flat memory")
        self.numel = sum(p.numel() for p in self.params)
        self._cache: dict = {}

    def __len__(self) -> int:
        return len(self.params)

    def __repr__(self) -> str:
        half = f", params16={self.params16[0].dtype}" if self.params16 else ""
        return f"AdamTensors({len(self)} tensors, {self.numel:,} elements, {self.device}{half})"

    def step(self, step: int, cfg: AdamConfig, backend: str = "numba") -> None:
        """One Adam(W) step in place; ``step`` counts from 1, as in torch and DeepSpeed."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be an int >= 1 (it counts from 1), got {step!r}")
        if not isinstance(cfg, AdamConfig):
            raise TypeError(f"cfg must be a zero_ref.optim.AdamConfig, not {type(cfg).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        getattr(self, f"_step_{backend}")(step, cfg)

    # -- backends -------------------------------------------------------------------------

    def _step_torch(self, step, cfg):
        for i, (p, g, m, v) in enumerate(zip(self.params, self.grads, self.exp_avgs, self.exp_avg_sqs)):
            adam_step_(p, g.float(), m, v, step, cfg)
            if self.params16:
                self.params16[i].copy_(p)

    def _fp32_only(self, backend):
        if self.params16 or any(g.dtype != torch.float32 for g in self.grads):
            raise TypeError(f"backend {backend!r} steps fp32 tensors only; 16-bit params16/grads need "
                            "backend='cuda' (or 'torch')")

    def _step_numba(self, step, cfg):
        if self.device.type != "cpu":
            raise ValueError(f"backend 'numba' runs on the CPU but the tensors are on {self.device}")
        self._fp32_only("numba")
        from zero_ref.kernels import numba_cpu

        k = AdamConstants.from_config(step, cfg)
        if len(self) == 1:
            if "arrays" not in self._cache:
                self._cache["arrays"] = [t[0].detach().reshape(-1).numpy() for t in
                                         (self.params, self.grads, self.exp_avgs, self.exp_avg_sqs)]
            numba_cpu.step_flat(*self._cache["arrays"], k)
        else:
            if "table" not in self._cache:
                rows = zip(self.params, self.grads, self.exp_avgs, self.exp_avg_sqs)
                self._cache["table"] = (np.array([[t.data_ptr() for t in row] for row in rows], dtype=np.int64),
                                        np.array([p.numel() for p in self.params], dtype=np.int64))
            numba_cpu.step_multi(*self._cache["table"], k)

    def _step_numba_cuda(self, step, cfg):
        self._fp32_only("numba_cuda")
        from zero_ref.kernels import numba_cuda

        numba_cuda.step(self, AdamConstants.from_config(step, cfg))

    def _step_cuda(self, step, cfg):
        if self.device.type != "cuda":
            raise ValueError(f"backend 'cuda' needs CUDA tensors but they are on {self.device}")
        from zero_ref.kernels import cuda_ext

        cuda_ext.step(self, AdamConstants.from_config(step, cfg))


def adam_step(params, grads, exp_avgs, exp_avg_sqs, step: int, cfg: AdamConfig, backend: str = "numba",
              params16=None) -> None:
    """One fused Adam(W) step in place on one tensor or on lists of tensors (see the module doc)."""
    AdamTensors(params, grads, exp_avgs, exp_avg_sqs, params16).step(step, cfg, backend)


def available_backends() -> dict[str, str]:
    """Each backend and whether it can run here: ``"ok"`` or the reason it cannot."""
    out = {"torch": "ok"}
    try:
        import numba  # noqa: F401
        out["numba"] = "ok"
    except ImportError as e:  # pragma: no cover - numba is a course requirement
        out["numba"] = f"numba is not installed ({e})"
    from zero_ref.kernels import cuda_ext, numba_cuda

    out["numba_cuda"] = numba_cuda.unavailable_reason() or "ok"
    out["cuda"] = cuda_ext.unavailable_reason() or "ok"
    return out


def adam_update_(params, grads, exp_avgs, exp_avg_sqs, step: int, cfg: AdamConfig, backend: str = "torch") -> None:
    """A ZeRO stage's Adam(W) step on a tensor each, or on lists of tensors, with one of ``KERNELS``: ``"torch"``,
    ``optim.adam_step_`` per tensor (bit for bit torch.optim.AdamW); ``"numba"``, the fused CPU kernel, one pass as
    DeepSpeed's FusedAdam and DeepSpeedCPUAdam make (its IEEE sqrt differs from torch's in the last bit of some
    elements), on the rank's share of the cores; ``"cuda"``, the CUDA extension's."""
    if isinstance(params, torch.Tensor):
        params, grads, exp_avgs, exp_avg_sqs = [params], [grads], [exp_avgs], [exp_avg_sqs]
    if backend == "torch":
        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            adam_step_(p, g, m, v, step, cfg)
        return
    if backend not in KERNELS:
        raise ValueError(f"unknown Adam kernel {backend!r}; choose one of {', '.join(KERNELS)}")
    if backend == "cuda":
        adam_step(params, grads, exp_avgs, exp_avg_sqs, step, cfg, backend="cuda")
        return
    import numba
    threads = torch.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))  # the rank's share of the cores
    try:
        adam_step(params, grads, exp_avgs, exp_avg_sqs, step, cfg, backend="numba")
    finally:
        # Numba's OpenMP layer sets the process's OpenMP thread count, which is torch's too: restore it, or
        # later torch reductions silently run on more threads (and add in another order).
        torch.set_num_threads(threads)
