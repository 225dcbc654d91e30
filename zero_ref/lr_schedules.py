"""DeepSpeed's learning-rate schedules (``"scheduler": {"type": ..., "params": ...}``), pure Python.

Each schedule holds ``last_batch_iteration`` (-1 before the first step) and, like DeepSpeed's
``runtime/lr_schedules.py``, writes the rate into ``optimizer.param_groups[i]["lr"]`` on
construction and on every ``step()``. The engine calls ``step()`` after each *applied* optimizer
step (an fp16 overflow skips it), so the rate used by optimizer step k (k = 1, 2, ...) is the one
set after k - 1 scheduler steps:

    WarmupLR        lr(i) = min + (max - min) · γ(i),  γ = log(i + 1) / log(W)  ("log")  or  i / W  ("linear")
                    for i < W, then 1.                 i = last_batch_iteration, W = max(2, warmup_num_steps)
    WarmupDecayLR   the same warm-up, then γ = max(0, (T - i) / max(1, T - W))   (T = total_num_steps)
    WarmupCosineLR  lr = base lr · ratio: warm-up from warmup_min_ratio to 1, then
                    cos_min_ratio + (1 - cos_min_ratio) · (1 + cos(π · min(1, (i - W + 1) / max(1, T - W)))) / 2

Before the first step (i = -1) the rate is the minimum (WarmupLR, WarmupDecayLR: ``warmup_min_lr``;
WarmupCosineLR: 0): DeepSpeed's first optimizer step therefore runs at ``warmup_min_lr``, and with
the log warm-up the second one too (log(0 + 1) = 0). tests/test_engine.py checks these rates
against DeepSpeed's classes step by step.
"""
from __future__ import annotations

import math

SCHEDULES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")


class WarmupLR:
    """Warm up from ``warmup_min_lr`` to ``warmup_max_lr`` (default: the optimizer's lr) over
    ``warmup_num_steps`` steps, then stay there."""

    def __init__(self, optimizer, warmup_min_lr: float = 0.0, warmup_max_lr: float | None = None,
                 warmup_num_steps: int = 1000, warmup_type: str = "log", last_batch_iteration: int = -1):
        if isinstance(warmup_num_steps, bool) or not isinstance(warmup_num_steps, int) or warmup_num_steps <= 0:
            raise ValueError(f"warmup_num_steps must be a positive integer, got {warmup_num_steps!r}")
        if warmup_type not in ("log", "linear"):
            raise ValueError(f"warmup_type must be 'log' or 'linear', got {warmup_type!r}")
        self.optimizer = optimizer
        groups = optimizer.param_groups
        self.min_lrs = [float(warmup_min_lr)] * len(groups)
        self.max_lrs = [g["lr"] if warmup_max_lr is None else float(warmup_max_lr) for g in groups]
        self.warmup_num_steps = max(2, warmup_num_steps)  # (DeepSpeed's guard against log(1) = 0)
        self.warmup_type = warmup_type
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._apply()

    def _warmup(self, i: int) -> float:
        if self.warmup_type == "log":
            return math.log(i + 1) / math.log(self.warmup_num_steps)
        return i / self.warmup_num_steps

    def _gamma(self, i: int) -> float:
        return self._warmup(i) if i < self.warmup_num_steps else 1.0

    def get_lr(self) -> list[float]:
        i = self.last_batch_iteration
        if i < 0:
            return list(self.min_lrs)
        gamma = self._gamma(i)
        return [lo + (hi - lo) * gamma for lo, hi in zip(self.min_lrs, self.max_lrs)]

    def _apply(self) -> None:
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = self.last_batch_iteration + 1 if last_batch_iteration is None else last_batch_iteration
        self._apply()

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]


class WarmupDecayLR(WarmupLR):
    """WarmupLR's warm-up, then a linear decay to 0 at ``total_num_steps``."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_lr: float = 0.0, warmup_max_lr: float = 0.001,
                 warmup_num_steps: int = 1000, warmup_type: str = "log", last_batch_iteration: int = -1):
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_batch_iteration)

    def _gamma(self, i: int) -> float:
        if i < self.warmup_num_steps:
            return self._warmup(i)
        return max(0.0, (self.total_num_steps - i) / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(WarmupLR):
    """Scale the optimizer's own lr: warm up from ``warmup_min_ratio`` to 1, then a cosine down to
    ``cos_min_ratio`` at ``total_num_steps``."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0, warmup_num_steps: int = 1000,
                 cos_min_ratio: float = 0.0001, warmup_type: str = "log", last_batch_iteration: int = -1):
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio, self.cos_min_ratio = float(warmup_min_ratio), float(cos_min_ratio)
        self.org_lrs = [g["lr"] for g in optimizer.param_groups]
        super().__init__(optimizer, 0.0, None, warmup_num_steps, warmup_type, last_batch_iteration)

    def ratio(self) -> float:
        i = self.last_batch_iteration
        if i < 0:
            return 0.0
        if i < self.warmup_num_steps:
            return self.warmup_min_ratio + self._warmup(i) * (1.0 - self.warmup_min_ratio)
        progress = min(1.0, (i - self.warmup_num_steps + 1) / max(1, self.total_num_steps - self.warmup_num_steps))
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * (1 + math.cos(math.pi * progress)) / 2)

    def get_lr(self) -> list[float]:
        r = self.ratio()
        return [lr * r for lr in self.org_lrs]


def build(name: str, optimizer, params: dict):
    """The schedule ``name`` (one of ``SCHEDULES``) with DeepSpeed's ``params``, on ``optimizer``."""
    return {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR}[name](
        optimizer, **params)
