"""Dropout that keeps its mask for backward in one byte per element, as the fused CUDA kernel does.

The course GPT and the tensor- and pipeline-parallel layers built from it share it, so their saved
activations are the same bytes."""
from __future__ import annotations

import torch


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that saves a 1-byte mask for backward (what the fused CUDA kernel does)."""
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]
