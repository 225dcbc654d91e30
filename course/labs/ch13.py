"""Chapter 13's harness: two misreadings of DeepSpeed's loss-scale rule, to tell apart from it (Task 13.1).

``misreading(name, ...)`` builds a scaler that follows one of them; ``scales(scaler, pattern)`` replays an overflow
pattern and returns the scale after each step; ``shortest_length`` finds, by trying every pattern, how long the
shortest pattern is on which a misreading's scales differ from DeepSpeed's.
"""
import itertools

from zero_ref.precision import DynamicLossScaler

MISREADINGS = ("no_minus_one", "refill_every_step")


class _NoMinusOne(DynamicLossScaler):
    """Counts the current clean step in ``stable`` (``cur_iter - last_overflow_iter``, no ``- 1``)."""

    def update_scale(self, overflow: bool) -> None:
        if not overflow:
            self.last_overflow_iter -= 1  # so that DeepSpeed's stable = cur_iter - last - 1 counts one more
            super().update_scale(False)
            self.last_overflow_iter += 1
        else:
            super().update_scale(True)


def misreading(name: str, init_scale: float, window: int, hysteresis: int) -> DynamicLossScaler:
    """A scaler following the misreading ``name`` (one of ``MISREADINGS``)."""
    if name == "no_minus_one":
        return _NoMinusOne(init_scale=init_scale, scale_window=window, delayed_shift=hysteresis)
    if name == "refill_every_step":  # DeepSpeed's consecutive_hysteresis=True, off by default
        return DynamicLossScaler(init_scale=init_scale, scale_window=window, delayed_shift=hysteresis,
                                 consecutive_hysteresis=True)
    raise ValueError(f"unknown misreading {name!r}; choose one of {', '.join(MISREADINGS)}")


def scales(scaler: DynamicLossScaler, pattern) -> list[float]:
    """The scale after each step of the overflow ``pattern`` (a sequence of bools)."""
    out = []
    for overflow in pattern:
        scaler.update_scale(bool(overflow))
        out.append(scaler.cur_scale)
    return out


def differs(name: str, pattern, init_scale: float, window: int, hysteresis: int) -> bool:
    """Whether the misreading's scales differ from DeepSpeed's after some step of ``pattern``."""
    ds = DynamicLossScaler(init_scale=init_scale, scale_window=window, delayed_shift=hysteresis)
    return scales(ds, pattern) != scales(misreading(name, init_scale, window, hysteresis), pattern)


def shortest_length(name: str, init_scale: float, window: int, hysteresis: int, longest: int = 10) -> int:
    """The length of the shortest overflow pattern that tells the misreading from DeepSpeed's rule."""
    for n in range(1, longest + 1):
        if any(differs(name, p, init_scale, window, hysteresis) for p in itertools.product((False, True), repeat=n)):
            return n
    raise ValueError(f"no pattern of up to {longest} steps tells {name!r} apart")
