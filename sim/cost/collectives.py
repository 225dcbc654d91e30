"""The α-β cost of collectives, as pure formulas (seconds from bytes, group size, latency, bandwidth).

Collectives of S bytes over n ranks on a link of bandwidth B (after efficiency) and latency α:

    ring all-reduce          2(n−1)α + 2(n−1)/n · S/B
    tree all-reduce          2⌈log2 n⌉α + 2(n−1)/n · S/B   (bandwidth × tree_bw_efficiency)
    reduce-scatter / gather  (n−1)α + (n−1)/n · S/B        (S = the full, unsharded buffer)
    point-to-point           α + S/B

``all_reduce`` takes the cheaper of ring and tree, as NCCL's tuner does. With equal bandwidth
terms the tree never loses (⌈log2 n⌉ ≤ n − 1); calibrating ``tree_bw_efficiency`` below 1 makes the
ring win for large messages. Every constant lives in ``Costs`` and can be overridden.
"""
from __future__ import annotations

import math


def ring_all_reduce(size: float, n: int, alpha: float, bw: float) -> float:
    return 0.0 if n == 1 else 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bw


def tree_all_reduce(size: float, n: int, alpha: float, bw: float) -> float:
    return 0.0 if n == 1 else 2 * math.ceil(math.log2(n)) * alpha + 2 * (n - 1) / n * size / bw


def reduce_scatter(size: float, n: int, alpha: float, bw: float) -> float:
    return 0.0 if n == 1 else (n - 1) * alpha + (n - 1) / n * size / bw


all_gather = reduce_scatter  # same cost: (n−1)α + (n−1)/n · S/B


def point_to_point(size: float, alpha: float, bw: float) -> float:
    return alpha + size / bw
