"""A pipeline stage that sleeps instead of computing, so that stages sharing a few cores do not slow each other
and a measured step shows the schedule and its messages alone."""
from __future__ import annotations

import time

import torch
from torch import nn


class Sleep(torch.autograd.Function):
    """On the activations' path: forward sleeps ``t_f``, backward (the input gradient) ``t_b``."""

    @staticmethod
    def forward(ctx, x, t_f, t_b):
        time.sleep(t_f)
        ctx.t_b = t_b
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.t_b)
        return grad, None, None


class SleepW(torch.autograd.Function):
    """On the weight's own path: its backward (the weight gradient) sleeps ``t_w``."""

    @staticmethod
    def forward(ctx, w, t_w):
        ctx.t_w = t_w
        return w.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.t_w)
        return grad, None


class SleepStage(nn.Module):
    """A stage for ``zero_ref.parallel.pipeline.Pipeline``: forward sleeps ``t_f``, backward ``t_b + t_w``; the
    first stage turns token ids into activations of width ``d``, the last (given targets) returns a scalar."""

    def __init__(self, t_f: float, t_b: float, t_w: float, d: int = 4):
        super().__init__()
        self.t_f, self.t_b, self.t_w, self.d, self.w = t_f, t_b, t_w, d, nn.Parameter(torch.ones(d))

    def activation_shape(self, batch: int, seq: int) -> tuple[int, int, int]:
        return (batch, seq, self.d)

    def forward(self, x, targets=None):
        if not x.is_floating_point():  # the first stage receives token ids
            x = x.float().unsqueeze(-1).expand(*x.shape, self.d)
        y = Sleep.apply(x * SleepW.apply(self.w, self.t_w), self.t_f, self.t_b)
        return y.mean() if targets is not None else y
