"""A stage's backward in two passes, for zero-bubble schedules: B (input gradient) now, W (weight gradient) later.

B runs autograd from the stage's output to its input only, and keeps, at every node where the input's
path meets a parameter's (a GEMM's output, say), the gradient arriving there; W later runs autograd
from those kept gradients to the parameters. Each GEMM's backward thus splits in two: dX = dY·Wᵀ in B,
dW = Xᵀ·dY in W; nothing is computed twice. The graph surgery is torch's own
(torch/distributed/pipelining/_backward.py: ``stage_backward_input``, ``stage_backward_weight``), what
torch 2.13's zero-bubble schedules run (stage.py, ``backward_one_chunk(full_backward=False)`` and
``backward_weight_one_chunk``).

The first stage has no input gradient to send (its input is token ids): its B does nothing and its W
runs the whole backward, as torch's does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight


@dataclass
class PendingWeightGrad:
    """What a W needs from its B: the parameters, and the kept gradients (or, on the first stage, the output)."""

    params: list
    groups: list | None = None
    out: torch.Tensor | None = None
    grad: torch.Tensor | None = None


def input_backward(out: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor | None,
                   params: list) -> PendingWeightGrad:
    """B: set ``x.grad`` (``grad`` is d loss / d out; None when ``out`` is the loss); ``x`` None on the first stage."""
    if x is None:
        return PendingWeightGrad(params, out=out, grad=grad)
    _, groups = stage_backward_input([out], None if grad is None else [grad], [x], iter(params))
    return PendingWeightGrad(params, groups=groups)


def weight_backward(pending: PendingWeightGrad) -> None:
    """W: accumulate the parameters' gradients into ``.grad``."""
    if pending.groups is None:
        torch.autograd.backward(pending.out, pending.grad, inputs=pending.params)
    else:
        stage_backward_weight(iter(pending.params), pending.groups)
