"""Adam(W) on flat fp32 tensors: the step every ZeRO stage runs on its partition.

The arithmetic is torch.optim.AdamW's (and Adam's, for ``adamw=False``, where weight decay is
L2 added to the gradient), op for op, so a partitioned run matches the single-process optimizer
to the last bit on CPU. DeepSpeed's Adam has the same semantics (bias correction on by default).
The fused kernels build on this step: ``zero_ref.kernels.adam_update_`` runs it, or one of them, on lists.
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
