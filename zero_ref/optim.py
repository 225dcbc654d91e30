"""Adam(W) on flat fp32 tensors: the step every ZeRO stage runs on its partition.

The arithmetic is torch.optim.AdamW's (and Adam's, for ``adamw=False``, where weight decay is
L2 added to the gradient), op for op, so a partitioned run matches the single-process optimizer
to the last bit on CPU. DeepSpeed's Adam has the same semantics (bias correction on by default).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AdamConfig:
    """Hyper-parameters, named as torch.optim.AdamW names them."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2
    adamw: bool = True  # decoupled weight decay (AdamW); False = L2 in the gradient (Adam)

    def __post_init__(self):
        b1, b2 = self.betas
        for name, ok in (("lr", self.lr >= 0), ("eps", self.eps >= 0), ("weight_decay", self.weight_decay >= 0),
                         ("betas[0]", 0 <= b1 < 1), ("betas[1]", 0 <= b2 < 1)):
            if not ok:
                raise ValueError(f"invalid Adam hyper-parameter {name}: {getattr(self, name.split('[')[0])}")


# Elements per pass over a flat buffer: the step's temporaries stay 1 MiB, which the allocator reuses from
# step to step, where a buffer-sized one may be mapped and faulted in afresh every step; and a chunk that fits
# the caches keeps the step's seven passes out of memory (benchmarks/adam_chunks.py: 3.3× on 3.4M elements).
CHUNK = 1 << 18


def adam_step_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
               step: int, cfg: AdamConfig) -> None:
    """One Adam(W) step in place on ``param`` and both moments; ``step`` counts from 1.

    A long flat buffer is stepped in chunks: every operation is element-wise, so the result is
    the same to the bit, but the temporaries (``sqrt``, the division) stay chunk-sized instead
    of doubling the optimizer's memory for a moment, and each chunk's passes run in cache."""
    if param.dim() == 1 and param.numel() > CHUNK:
        for s in range(0, param.numel(), CHUNK):
            e = s + CHUNK
            adam_step_(param[s:e], grad[s:e], exp_avg[s:e], exp_avg_sq[s:e], step, cfg)
        return
    b1, b2 = cfg.betas
    if cfg.weight_decay:
        if cfg.adamw:
            param.mul_(1 - cfg.lr * cfg.weight_decay)
        else:
            grad = grad.add(param, alpha=cfg.weight_decay)
    exp_avg.lerp_(grad, 1 - b1)
    exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    step_size = cfg.lr / (1 - b1**step)
    denom = (exp_avg_sq.sqrt() / (1 - b2**step) ** 0.5).add_(cfg.eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


KERNELS = ("torch", "numba", "cuda")  # what a stage's optimizer step can run on its partition


def adam_update_(params, grads, exp_avgs, exp_avg_sqs, step: int, cfg: AdamConfig, kernel: str = "torch") -> None:
    """One Adam(W) step on a tensor each, or on lists of tensors, with ``kernel``: ``"torch"``, ``adam_step_``
    (bit for bit torch.optim.AdamW); ``"numba"``, zero_ref.kernels' fused CPU kernel, one pass as DeepSpeed's
    FusedAdam and DeepSpeedCPUAdam make (its IEEE sqrt differs from torch's in the last bit of some elements);
    ``"cuda"``, the CUDA extension's."""
    if isinstance(params, torch.Tensor):
        params, grads, exp_avgs, exp_avg_sqs = [params], [grads], [exp_avgs], [exp_avg_sqs]
    if kernel == "torch":
        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            adam_step_(p, g, m, v, step, cfg)
        return
    if kernel not in KERNELS:
        raise ValueError(f"unknown Adam kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    from zero_ref.kernels import adam_step
    if kernel == "cuda":
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
