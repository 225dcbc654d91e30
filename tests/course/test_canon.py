"""course.canon: one text per value, whatever type or summation order produced it; different values differ."""
from fractions import Fraction

import numpy as np
import pytest
import torch

from course.canon import canon, echo


@pytest.mark.parametrize("same", [
    (16384, 16384.0, np.int64(16384), np.float32(16384), torch.tensor(16384.), torch.tensor(16384)),
    ([1, 2], (1, 2), np.array([1, 2]), torch.tensor([1.0, 2.0]), range(1, 3), [1.0, np.int32(2)]),
    (True, np.bool_(True), torch.tensor(True)),
    ({"b": 2, "a": 1.0}, {"a": np.int64(1), "b": 2.0}),
    ({3, 1, 2}, frozenset([2, 3, 1])),
    (0.1 + 0.2, 0.3, 0.30000000000000004),
    (0.0, -0.0, 1e-300 * 1e-300),
    (2 / 3, Fraction(2, 3), np.float64(2) / 3),
    (1 / 3 * 3, 1.0, 1),
])
def test_equal_values_print_the_same(same):
    texts = {canon(v) for v in same}
    assert len(texts) == 1, texts


def test_another_summation_order_prints_the_same():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(10_000)
    forward, backward, pairwise = float(sum(x)), float(sum(x[::-1])), float(np.sum(x))
    assert len({forward, backward, pairwise}) > 1  # the raw sums do differ
    assert canon(forward) == canon(backward) == canon(pairwise)


@pytest.mark.parametrize("a, b", [
    (16384, 16385), (0.5, 0.5001), ([1, 2], [2, 1]), ((1, 2), (1, 2, 3)), (True, 1 == 0),
    ({"a": 1}, {"a": 2}), ("x", "y"), (None, 0), (1.2345e-7, 1.2346e-7), (1e20, 1.00001e20), (16384.0, 16384.5),
])
def test_different_values_print_differently(a, b):
    assert canon(a) != canon(b)


def test_format():
    assert canon(14_765_625_000) == "14,765,625,000"
    assert canon(0.123456789) == "0.123457"
    assert canon(0.123456789, digits=3) == "0.123"
    assert canon(2.5e-9) == "2.5e-09"
    assert canon(["a", 1.5, None]) == "['a', 1.5, None]"
    assert canon({"k": (1, 2)}) == "{'k': [1, 2]}"
    assert canon(float("nan")) == "nan" and canon(-float("inf")) == "-inf"
    with pytest.raises(ValueError, match="digits"):
        canon(1.0, digits=0)


def test_echo(capsys):
    echo("yours:", 16384.0, "ratio", 2 / 3, digits=3)
    echo("list", [np.float32(0.5), 1])
    assert capsys.readouterr().out == "yours: 16,384 ratio 0.667\nlist [0.5, 1]\n"


def test_integers_stay_exact_at_few_digits():
    assert canon(16384, digits=2) == canon(16384.0, digits=2) == canon(16384.0 + 1e-9, digits=2) == "16,384"
    assert canon(16384.3, digits=3) == "16,400"  # not an integer: rounded like any float
    assert canon(1e-10) == "1e-10"  # small is not zero


def test_adamw_atol_is_one_percent_of_a_step():
    from course.canon import adamw_atol
    assert adamw_atol(1e-3) == pytest.approx(1e-5) and adamw_atol(1e-2) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="lr must be positive"):
        adamw_atol(0)
