"""The torch optimizer a scheduler callable receives (``initialize(lr_scheduler=callable)``).

DeepSpeed calls ``lr_scheduler(self.basic_optimizer)`` (``runtime/engine.py``, ``_configure_lr_scheduler``):
the torch optimizer whose param_groups its ZeRO optimizer steps with, so a torch scheduler such as the
HF Trainer's ``LambdaLR`` sets the rates that are used. zero_ref's stage is not a ``torch.optim.Optimizer``
(torch schedulers refuse it); ``BasicOptimizer`` is one, holding the stage's own param_groups.
"""
from __future__ import annotations

import torch

__all__ = ["BasicOptimizer"]


class BasicOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` over ``stage.param_groups`` (the same dicts); ``step`` is the engine's."""

    def __init__(self, stage) -> None:
        super().__init__([torch.zeros(0, requires_grad=True)], {})
        self.param_groups = stage.param_groups

    def step(self, closure=None):  # the engine steps the stage at the accumulation boundary
        return None
