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

    LRRangeTest     lr = min · (1 + rate · (i + 1) / S)   (floor((i + 1) / S) with the staircase)
    OneCycle        one triangle of C = S1 + S2 steps: min → max over S1, back over S2 (stairs optional),
                    then min / (1 + decay_rate · (i - C + 1) / decay_step_size); momentum (β1) the
                    mirror image, max → min → max (β2 is set to 0.99, as DeepSpeed sets it)

Before the first step (i = -1) the rate is the minimum (WarmupLR, WarmupDecayLR: ``warmup_min_lr``;
WarmupCosineLR: 0): DeepSpeed's first optimizer step therefore runs at ``warmup_min_lr``, and with
the log warm-up the second one too (log(0 + 1) = 0). tests/zero_ref/test_engine.py checks these rates
against DeepSpeed's classes step by step.
"""
from __future__ import annotations

import math

SCHEDULES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")
VALID_LR_SCHEDULES = ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]  # DeepSpeed's list


class _Schedule:
    """What every schedule shares: writing the rates into the optimizer's groups, the last rates written,
    and the position (``last_batch_iteration``) that a checkpoint saves. Each schedule's ``step`` keeps
    DeepSpeed's parameter name for it (``last_batch_iteration`` or ``batch_iteration``)."""

    def _write(self, lrs: list[float]) -> None:
        self._last_lr = list(lrs)
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]


class WarmupLR(_Schedule):
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
            self._write(self.get_lr())

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

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = self.last_batch_iteration + 1 if last_batch_iteration is None else last_batch_iteration
        self._write(self.get_lr())


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


class LRRangeTest(_Schedule):
    """Leslie Smith's learning-rate range test: the rate grows from ``lr_range_test_min_lr`` by
    ``lr_range_test_step_rate`` every ``lr_range_test_step_size`` steps, continuously or in stairs."""

    def __init__(self, optimizer, lr_range_test_min_lr: float = 1e-3, lr_range_test_step_size: int = 2000,
                 lr_range_test_step_rate: float = 1.0, lr_range_test_staircase: bool = False,
                 last_batch_iteration: int = -1):
        if isinstance(lr_range_test_step_size, bool) or not isinstance(lr_range_test_step_size, int) \
                or lr_range_test_step_size <= 0:
            raise ValueError(f"lr_range_test_step_size must be a positive integer, got {lr_range_test_step_size!r}")
        self.optimizer = optimizer
        self.min_lrs = [float(lr_range_test_min_lr)] * len(optimizer.param_groups)
        self.step_size, self.step_rate, self.staircase = lr_range_test_step_size, lr_range_test_step_rate, lr_range_test_staircase
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._write(self.min_lrs)

    def get_lr(self) -> list[float]:
        interval = (self.last_batch_iteration + 1) / self.step_size
        increase = 1 + self.step_rate * (math.floor(interval) if self.staircase else interval)
        return [lr * increase for lr in self.min_lrs]

    def step(self, batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = self.last_batch_iteration + 1 if batch_iteration is None else batch_iteration
        self._write(self.get_lr())


class OneCycle(LRRangeTest):
    """The 1-cycle policy: the rate climbs from ``cycle_min_lr`` to ``cycle_max_lr`` and back in one
    cycle of ``cycle_first_step_size + cycle_second_step_size`` steps, then decays; Adam's β1 moves the
    other way (``cycle_max_mom`` → ``cycle_min_mom`` → back), with β2 set to 0.99 as DeepSpeed sets it."""

    def __init__(self, optimizer, cycle_min_lr: float, cycle_max_lr: float, decay_lr_rate: float = 0.0,
                 cycle_first_step_size: int = 2000, cycle_second_step_size: int | None = None,
                 cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None,
                 decay_step_size: int = 0, cycle_momentum: bool = True, cycle_min_mom: float = 0.8,
                 cycle_max_mom: float = 0.9, decay_mom_rate: float = 0.0, last_batch_iteration: int = -1):
        first = float(cycle_first_step_size)
        second = first if cycle_second_step_size is None else float(cycle_second_step_size)
        if first <= 0 or second < 0:
            raise ValueError(f"cycle_first_step_size must be positive and cycle_second_step_size non-negative, "
                             f"got {cycle_first_step_size!r} and {cycle_second_step_size!r}")
        self.optimizer = optimizer
        self.first, self.second, self.total = first, second, first + second
        self.first_stairs = cycle_first_stair_count
        self.second_stairs = cycle_first_stair_count if cycle_second_stair_count is None else cycle_second_stair_count
        self.decay_step_size = decay_step_size
        n = len(optimizer.param_groups)
        self.min_lrs, self.max_lrs = [float(cycle_min_lr)] * n, [float(cycle_max_lr)] * n
        self.decay_lr_rate, self.decay_mom_rate = decay_lr_rate, decay_mom_rate
        # (DeepSpeed skips a decay whose rate or step size is 0: its formula would divide by 0)
        self.skip_lr_decay = math.isclose(decay_step_size, 0) or math.isclose(decay_lr_rate, 0)
        self.skip_mom_decay = math.isclose(decay_step_size, 0) or math.isclose(decay_mom_rate, 0)
        self.cycle_momentum = cycle_momentum and all("betas" in g for g in optimizer.param_groups)
        self.min_moms, self.max_moms = [(float(cycle_min_mom), 0.99)] * n, [(float(cycle_max_mom), 0.99)] * n
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._write(self.min_lrs)
            if self.cycle_momentum:
                for group, betas in zip(optimizer.param_groups, self.min_moms):
                    group["betas"] = betas

    def _scale(self) -> float:
        """Where the step is on the triangle: 0 at its ends, 1 at its peak (in stairs if asked)."""
        i = self.last_batch_iteration + 1
        x = 1.0 + i / self.total - math.floor(1 + i / self.total)
        ratio = self.first / self.total
        rising = x <= ratio
        scale = x / ratio if rising else (x - 1) / (ratio - 1)
        stairs = self.first_stairs if rising else self.second_stairs
        if stairs > 0:  # from the integer position, as DeepSpeed: the float scale can land a hair under a stair
            at = i % self.total
            position = at * stairs / self.first if at <= self.first else (self.total - at) * stairs / self.second
            scale = math.floor(position) / stairs
        return scale

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < self.total:
            s = self._scale()
            return [lo + (hi - lo) * s for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        factor = 1 + self.decay_lr_rate * (self.last_batch_iteration - self.total + 1) / self.decay_step_size
        return [lo / factor for lo in self.min_lrs]

    def get_mom(self) -> list[tuple[float, float]]:
        if self.last_batch_iteration < self.total:
            s = self._scale()
            return [(hi[0] - (hi[0] - lo[0]) * s, lo[1]) for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        factor = 1 + self.decay_mom_rate * (self.last_batch_iteration - self.total + 1) / self.decay_step_size
        return [(b1 * factor, b2) for b1, b2 in self.max_moms]

    def step(self, batch_iteration: int | None = None) -> None:
        super().step(batch_iteration)
        if self.cycle_momentum:
            for group, betas in zip(self.optimizer.param_groups, self.get_mom()):
                group["betas"] = betas


def build(name: str, optimizer, params: dict):
    """The schedule ``name`` (one of ``SCHEDULES``) with DeepSpeed's ``params``, on ``optimizer``."""
    return {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR,
            "OneCycle": OneCycle, "LRRangeTest": LRRangeTest}[name](optimizer, **params)
