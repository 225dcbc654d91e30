"""A hand-written pipeline executor on real ranks, against one process: the forwards and backwards each stage ran
(recorded by a wrapper around its stage), the last stage's losses, and every parameter's gradient."""
from __future__ import annotations

import torch
from torch import nn

from zero_ref.models import GPT, make_batch
from zero_ref.parallel.pipeline import split_gpt


class _Tag(torch.autograd.Function):
    """Identity; its backward runs when micro-batch ``i``'s backward reaches the stage's output."""

    @staticmethod
    def forward(ctx, y, i, ops):
        ctx.i, ctx.ops = i, ops
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        ctx.ops.append(("B", ctx.i, 0))
        return grad, None, None


class RecordedStage(nn.Module):
    """``inner`` that appends ("F", i, 0) to ``ops`` at each forward and ("B", i, 0) when its backward starts;
    forwards come in micro-batch order in every schedule, so their count numbers them."""

    def __init__(self, inner: nn.Module, ops: list):
        super().__init__()
        self.inner, self.ops = inner, ops

    def forward(self, x, targets=None):
        i = sum(kind == "F" for kind, _, _ in self.ops)
        self.ops.append(("F", i, 0))
        return _Tag.apply(self.inner(x, targets), i, self.ops)


def run_executor(rank: int, world: int, executor, cfg, m: int, batch: int = 2) -> dict:
    """``executor(stage, rank, world, micro_batches, shape)`` on this rank's stage of ``GPT(cfg)`` (seed 0), one
    stage per rank, ``m`` micro-batches of ``batch`` sequences: {"ops", "losses", "grads" (by GPT name)}."""
    torch.manual_seed(0)
    stage, ops = split_gpt(GPT(cfg), world)[rank], []
    idx, targets = make_batch(cfg, batch * m, seed=0)
    losses = executor(RecordedStage(stage, ops), rank, world, list(zip(idx.chunk(m), targets.chunk(m))),
                      stage.activation_shape(batch, cfg.seq_len))
    grads = {k: t.grad for k, t in stage.gpt_state_dict(keep_vars=True).items()}
    return dict(ops=ops, losses=[float(l) for l in losses], grads=grads)


def accumulated_reference(cfg, m: int, batch: int = 2) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the same ``m`` micro-batches through the unsplit model, loss / m accumulated: (the m losses,
    each parameter's gradient by name)."""
    torch.manual_seed(0)
    whole = GPT(cfg)
    idx, targets = make_batch(cfg, batch * m, seed=0)
    losses = []
    for x, y in zip(idx.chunk(m), targets.chunk(m)):
        loss = whole(x, y)[1]
        losses.append(loss.item())
        (loss / m).backward()
    return losses, {k: p.grad for k, p in whole.named_parameters()}
