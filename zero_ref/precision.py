"""Mixed precision: which dtype a config asks for, fp16 loss scaling, and the overflow check.

fp16 has 5 exponent bits: small gradients underflow to zero. Loss scaling multiplies the loss
by a large factor S before backward, so the gradients are S times larger and stay
representable. The optimizer then divides them by S. If S is too large, some gradient becomes
inf or nan. In that case the step is *skipped* on every rank and S is lowered. bf16 has fp32's
exponent range, so it needs no loss scaling: DeepSpeed runs it with a static scale of 1.

    scaler = loss_scaler_from_config(cfg["fp16"])
    (loss * scaler.loss_scale).backward()
    overflow = has_overflow([p.grad for p in params])   # same answer on every rank
    if not overflow:
        ...unscale the grads by 1/scaler.loss_scale, then optimizer.step()...
    scaler.update_scale(overflow)

``DynamicLossScaler`` follows DeepSpeed's ``runtime/fp16/loss_scaler.py`` rule step for step.
tests/zero_ref/test_precision.py checks this against DeepSpeed 0.19.8 on random overflow sequences.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping

import torch
import torch.distributed as dist

from zero_ref import comm

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaleAtMinimum(RuntimeError):
    """Gradients overflowed although the loss scale was already at ``min_loss_scale``."""


class StaticLossScaler:
    """A fixed loss scale (fp16 ``loss_scale`` > 0, or 1 for bf16/fp32).

    ``update_scale`` does nothing. An overflow still skips the step, because the caller decides
    that from ``has_overflow``, not from the scaler.
    """

    dynamic = False

    def __init__(self, scale: float = 1.0):
        self.cur_scale = float(scale)

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.cur_scale

    def update_scale(self, overflow: bool) -> None:
        """Does nothing: a static scale never changes."""

    def state_dict(self) -> dict:
        return {"cur_scale": self.cur_scale}

    def load_state_dict(self, state: dict) -> None:
        self.cur_scale = float(state["cur_scale"])


class DynamicLossScaler(StaticLossScaler):
    """Halve the scale on overflow, double it after a window of clean steps (DeepSpeed's rule).

    ``update_scale(overflow)``, once per optimizer step:

    - Overflow, and hysteresis used up (``delayed_shift == 1`` or ``cur_hysteresis == 1``): the
      scale becomes ``max(scale / scale_factor, min_scale)``. If the scale already equals
      ``min_scale``, raise ``LossScaleAtMinimum`` instead (or keep the scale, if
      ``raise_error_at_min_scale`` is False).
    - Overflow with hysteresis left: ``cur_hysteresis -= 1`` and the scale stays. Hysteresis is
      how many overflows in a row are tolerated before the scale falls.
    - No overflow: with ``consecutive_hysteresis``, the hysteresis is refilled at once. Let
      ``stable = cur_iter - last_overflow_iter - 1``. When ``stable`` is a positive multiple of
      ``scale_window``, the scale is multiplied by ``scale_factor``, and the hysteresis is refilled
      if it was not refilled already. So after an overflow the scale grows on the
      (window+1)-th clean step, not on the window-th.

    Every update, except one that raises, sets ``last_overflow_iter`` on overflow and then
    adds 1 to ``cur_iter``.
    """

    dynamic = True

    def __init__(self, init_scale: float = 2**32, scale_window: int = 1000, min_scale: float = 1,
                 delayed_shift: int = 1, consecutive_hysteresis: bool = False,
                 raise_error_at_min_scale: bool = True, scale_factor: float = 2.0):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.scale_factor = scale_factor

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale and self.raise_error_at_min_scale:
                    raise LossScaleAtMinimum(self._at_minimum_message())
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable = self.cur_iter - self.last_overflow_iter - 1
            if stable > 0 and stable % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    def _at_minimum_message(self) -> str:
        return (f"fp16 loss scale is already at its minimum (min_loss_scale={self.min_scale:g}) and the gradients "
                f"overflowed again at iteration {self.cur_iter}; the scale cannot be lowered any further. "
                "This is the fp16 overflow spiral: the model produces inf/nan in fp16 even at a small scale, "
                "which is typical of a model pretrained in bf16. Fixes: train in bf16 instead "
                '("bf16": {"enabled": true}); it has fp32\'s range and needs no loss scaling. Or tune the '
                "fp16 section: a lower initial_scale_power, a larger hysteresis (more overflows tolerated "
                "before the scale falls) or loss_scale_window, or a different min_loss_scale. "
                "first_nonfinite() names the first tensor that holds inf/nan.")

    def state_dict(self) -> dict:
        """Everything ``update_scale`` reads, so a resumed run continues the same sequence."""
        return {k: getattr(self, k) for k in (
            "cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis", "scale_window", "min_scale",
            "delayed_shift", "consecutive_hysteresis", "raise_error_at_min_scale", "scale_factor")}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            if not hasattr(self, k):
                raise KeyError(f"unknown DynamicLossScaler state {k!r}")
            setattr(self, k, v)


# DeepSpeed 0.19.8's DeepSpeedFP16Config fields (runtime/precision_config.py); it rejects any other key.
FP16_DEFAULTS = {"enabled": False, "auto_cast": False, "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "consecutive_hysteresis": False,
                 "min_loss_scale": 1, "fp16_master_weights_and_grads": False}
_SCALER_KEYS = ("initial_scale_power", "loss_scale_window", "min_loss_scale", "hysteresis", "consecutive_hysteresis")


def loss_scaler_from_config(fp16: Mapping, *, deepspeed_gotcha: bool = False):
    """The loss scaler that DeepSpeed's ZeRO optimizers build from the ``fp16`` config section.

    ``loss_scale`` == 0 (the default) gives a dynamic scale. Any other value is a static scale.
    The dynamic scaler uses ``2**initial_scale_power``, ``loss_scale_window``, ``min_loss_scale``,
    ``hysteresis`` and ``consecutive_hysteresis``. A value of ``"auto"`` means the default, as in
    DeepSpeed. ``enabled`` is not read here: the caller passes the fp16 section once
    ``precision_from_config`` has chosen fp16.

    The gotcha, ``deepspeed_gotcha=True``: older DeepSpeed releases, with the dict-based
    ``runtime/config.py``, built the dynamic-scaler arguments in ``get_dynamic_loss_scale_args``
    only if at least one of ``_SCALER_KEYS`` was written in the fp16 dict. With only
    ``{"enabled": true}`` they returned None, and the ZeRO optimizers fell back to
    ``DynamicLossScaler``'s class defaults: init 2**32, hysteresis 1, window 1000, min 1. That is
    not the documented 2**16 and hysteresis 2. DeepSpeed 0.19.8, the version pinned here,
    no longer does this: ``DeepSpeedFP16Config.dynamic_loss_scale_args()``
    (``runtime/precision_config.py``) always returns the documented defaults. The default,
    False, therefore matches the pinned DeepSpeed; True reproduces the older releases.

    Errors, each a ``ValueError`` that names the key: an unknown key; a wrong type; a negative or
    non-finite ``loss_scale``; ``loss_scale_window`` or ``min_loss_scale`` <= 0 (DeepSpeed 0.19.8
    checks these too); ``hysteresis`` < 1. DeepSpeed accepts ``hysteresis`` 0 and then never
    lowers the scale. We refuse it rather than fail silently.
    """
    if not isinstance(fp16, Mapping):
        raise ValueError(f"the fp16 config section must be a dict, got {type(fp16).__name__}")
    unknown = sorted(set(fp16) - set(FP16_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown fp16 key(s) {unknown}; DeepSpeed's fp16 keys are {sorted(FP16_DEFAULTS)}")
    written = {k: v for k, v in fp16.items() if v != "auto"}

    scale = written.get("loss_scale", 0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale < 0:
        raise ValueError(f"fp16.loss_scale must be a finite number >= 0 (0 = dynamic), got {scale!r}")
    if scale != 0:
        return StaticLossScaler(float(scale))

    if deepspeed_gotcha and not any(k in written for k in _SCALER_KEYS):
        return DynamicLossScaler()  # the class defaults: 2**32, window 1000, min 1, hysteresis 1

    def integer(key: str, minimum: int | None = None) -> int:
        value = written.get(key, FP16_DEFAULTS[key])
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"fp16.{key} must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ValueError(f"fp16.{key} must be >= {minimum} with dynamic loss scaling, got {value}")
        return value

    consecutive = written.get("consecutive_hysteresis", False)
    if not isinstance(consecutive, bool):
        raise ValueError(f"fp16.consecutive_hysteresis must be true or false, got {consecutive!r}")
    return DynamicLossScaler(init_scale=2 ** integer("initial_scale_power"),
                             scale_window=integer("loss_scale_window", 1),
                             min_scale=integer("min_loss_scale", 1),
                             delayed_shift=integer("hysteresis", 1),
                             consecutive_hysteresis=consecutive)


def precision_from_config(cfg: Mapping) -> str:
    """``"fp16"``, ``"bf16"`` or ``"fp32"``, read from ``fp16.enabled`` and ``bf16.enabled``.

    ``bfloat16`` is DeepSpeed's older alias for ``bf16``. Both enabled is an error, as in
    DeepSpeed. DeepSpeed silently uses ``bf16`` when both ``bf16`` and ``bfloat16`` are given;
    we refuse that instead.
    """
    if "bf16" in cfg and "bfloat16" in cfg:
        raise ValueError("give either 'bf16' or its alias 'bfloat16', not both")
    fp16 = _enabled(cfg, "fp16")
    bf16 = _enabled(cfg, "bf16" if "bf16" in cfg else "bfloat16")
    if fp16 and bf16:
        raise ValueError("fp16.enabled and bf16.enabled are both true; enable at most one of them "
                         "(bf16 needs no loss scaling; fp16 uses the fp16 loss-scale keys)")
    return "fp16" if fp16 else "bf16" if bf16 else "fp32"


def _enabled(cfg: Mapping, key: str) -> bool:
    section = cfg.get(key, {})
    if not isinstance(section, Mapping):
        raise ValueError(f"config key {key!r} must be a dict like {{\"enabled\": true}}, got {section!r}")
    value = section.get("enabled", False)
    if not isinstance(value, bool):
        raise ValueError(f"{key}.enabled must be true or false, got {value!r}")
    return value


def _nonfinite(t: torch.Tensor) -> bool:
    # isfinite, not the sum trick (float(t.sum()) is inf): a sum of large finite values can overflow.
    return not bool(torch.isfinite(t).all())


def has_overflow(tensors: Iterable[torch.Tensor | None], group=None) -> bool:
    """True if any tensor on *any* rank of ``group`` holds inf or nan. ``None`` entries are skipped.

    Each rank checks its own tensors. One ``all_reduce(max)`` of a 0/1 flag then makes every rank
    take the same decision. Otherwise the rank that sees the overflow would skip the step while
    the others step, and the replicas would drift apart. Without an initialised process group,
    this is the local check.
    """
    local = any(_nonfinite(t) for t in tensors if t is not None)
    if not dist.is_initialized():
        return local
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    flag = torch.tensor([float(local)], device=device)
    comm.all_reduce(flag, op="max", group=group)
    return bool(flag.item())


def first_nonfinite(named_tensors) -> str | None:
    """The name of the first tensor that holds inf or nan, or None; for diagnostics.

    Accepts a dict or ``(name, tensor)`` pairs, e.g.
    ``((n, p.grad) for n, p in model.named_parameters())``. ``None`` tensors are skipped.
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    for name, t in items:
        if t is not None and _nonfinite(t):
            return name
    return None
