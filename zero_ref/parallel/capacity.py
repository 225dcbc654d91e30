"""MoE arithmetic without torch: how many tokens an expert takes per rank and what a dispatch moves.

One home for the two counts that ``moe`` (the real layer on gloo ranks) runs with and ``sim.moe``
prices: the capacity of GShard / Switch / DeepSpeed's gate, and the bytes of one fixed-slot
all-to-all (every rank sends its whole padded (experts, capacity, d) buffer, whatever the routing).
"""
from __future__ import annotations

import math


def capacity(tokens: int, num_experts: int, k: int = 1, capacity_factor: float = 1.0, min_capacity: int = 0) -> int:
    """Slots per expert on one rank: ceil(k · tokens · capacity_factor / num_experts), at least min_capacity."""
    return max(math.ceil(k * tokens * capacity_factor / num_experts), min_capacity)


def dispatch_bytes(num_experts: int, capacity: int, d_model: int, element_size: int = 4) -> int:
    """Payload of one dispatch (or combine) all-to-all on one rank: the whole padded (E, C, d) buffer."""
    return num_experts * capacity * d_model * element_size
