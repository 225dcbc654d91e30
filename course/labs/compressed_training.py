"""Data-parallel training of the course GPT whose gradients travel through a compression hook."""
from __future__ import annotations

import torch

from zero_ref import compression
from zero_ref.models import GPT
from zero_ref.optim import AdamConfig


def compressed_losses(cfg, hook, rank: int, world: int, *, steps: int, start: int, micro: int,
                      lr: float = 1e-2) -> list[float]:
    """This rank's loss at each of ``steps`` AdamW steps of ``CompressedDataParallel`` (seed 0) with ``hook``
    from step ``start`` on; each step reads ``micro`` sequences per rank of ``markov_batch(cfg, ..., seed=step)``."""
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = compression.CompressedDataParallel(model, hook, adam=AdamConfig(lr=lr), start_step=start)
    losses = []
    for step in range(steps):
        idx, targets = compression.markov_batch(cfg, micro * world, seed=step)
        mine = slice(rank * micro, (rank + 1) * micro)
        loss = model(idx[mine], targets[mine])[1]
        opt.backward(loss)
        opt.step()
        losses.append(loss.item())
    return losses
