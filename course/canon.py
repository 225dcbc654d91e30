"""Canonical printing for graded cells: a value prints the same whatever type or CPU produced it.

A graded cell passes when it prints what the reference printed, so what it prints must depend on
the value alone. ``canon`` turns a value into that text:

- an integer, or a float within 1e-9 (relative) of one, prints exactly as an integer, with thousands separators, so ``16384``,
  ``16384.0``, ``np.int64(16384)`` and ``torch.tensor(16384.)`` all print ``16,384``;
- any other float prints to ``digits`` significant digits (as an integer if it rounds to one) (6 unless stated): enough to tell a
  wrong answer, few enough that another summation order (another CPU's kernels) does not show;
- lists, tuples, ranges, arrays and tensors print as ``[a, b]``; dicts and sets in sorted order;
- booleans (numpy's and torch's too) print ``True`` / ``False``; strings inside containers are quoted.

``echo(*parts)`` prints its parts separated by spaces: strings as they are, everything else through
``canon``. Use it for every value a graded cell prints::

    echo("bytes per rank:", yours, "bubble:", bubble, digits=4)

``adamw_atol(lr)`` is the course's one tolerance for "the same training up to summation order".
"""

from __future__ import annotations

import math
import numbers

DIGITS = 6
_INT_LIMIT = 2 ** 53  # above this a float's integer digits are rounding noise: print it in e-notation
_INT_TOL = 1e-9      # a float this close (relatively) to an integer is that integer, printed exactly


def _scalar(x):
    """A Python scalar for numpy / torch scalars and one-element 0-d arrays; anything else unchanged."""
    if hasattr(x, "item") and getattr(x, "ndim", None) == 0:
        return x.item()
    return x


def _number(x: numbers.Real, digits: int) -> str:
    if isinstance(x, numbers.Integral):
        return f"{int(x):,}"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    nearest = round(x) if abs(x) < _INT_LIMIT else 0
    if nearest and abs(x - nearest) <= _INT_TOL * abs(x):  # an integer up to summation noise
        return f"{nearest:,}"
    rounded = float(f"{x:.{digits}g}")
    if rounded == 0:
        return "0"  # -0.0 and 1e-300 alike
    if rounded.is_integer() and abs(rounded) < _INT_LIMIT:
        return f"{int(rounded):,}"
    return f"{rounded:.{digits}g}"


def canon(value, digits: int = DIGITS) -> str:
    """The canonical text of ``value`` (see the module docstring)."""
    if not isinstance(digits, int) or digits < 1:
        raise ValueError(f"digits must be a positive integer, got {digits!r}")
    return _canon(value, digits, top=True)


def _canon(x, digits: int, top: bool) -> str:
    x = _scalar(x)
    if x is None or isinstance(x, bool):
        return str(x)
    if isinstance(x, str):
        return x if top else repr(x)
    if isinstance(x, numbers.Real):  # Fraction, numpy floats and ints too
        return _number(x, digits)
    if isinstance(x, numbers.Complex):
        return f"({_number(x.real, digits)}{'+' if x.imag >= 0 else '-'}{_number(abs(x.imag), digits)}j)"
    if isinstance(x, dict):
        items = sorted((_canon(k, digits, False), _canon(v, digits, False)) for k, v in x.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(x, (set, frozenset)):
        return "{" + ", ".join(sorted(_canon(v, digits, False) for v in x)) + "}"
    if hasattr(x, "tolist") and hasattr(x, "shape"):  # numpy arrays, torch tensors
        return _canon(x.tolist(), digits, False)
    if isinstance(x, (list, tuple, range)) or (hasattr(x, "__iter__") and hasattr(x, "__len__")
                                               and not hasattr(x, "keys") and not isinstance(x, bytes)):
        return "[" + ", ".join(_canon(v, digits, False) for v in x) + "]"
    return repr(x)


def echo(*parts, digits: int = DIGITS, sep: str = " ") -> None:
    """Print ``parts``: strings as they are, every other value through ``canon(value, digits)``."""
    print(sep.join(p if isinstance(p, str) else canon(p, digits) for p in parts))


def adamw_atol(lr: float) -> float:
    """How far apart fp32 AdamW weights may end when two runs differ only in the order their sums were
    taken (two ranks vs one process, one CPU's vector kernels vs another's): 1 % of one step.

    AdamW moves a weight by about ``lr`` per step whatever its gradient's size, so a rounding-sized change
    in a gradient entry near zero can move that weight by a visible share of ``lr``: 0.8e-6 (AVX2),
    1.2e-6 (AVX-512) and 1.4e-6 (ATen's portable kernels) after 3 steps at lr = 1e-3 on the course GPT,
    0.14 % of a step at most. A wrong shard, a missed or doubled update is off by a whole step."""
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    return lr / 100
