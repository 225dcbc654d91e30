"""Flat, padded buffers and their partitions: the bookkeeping under every ZeRO stage.

ZeRO lays a group of parameters end to end in one flat buffer, pads it so it splits evenly into
``world_size`` equal shards, and gives rank r the half-open range [r·S, (r+1)·S). A parameter
may straddle two shards; ``pieces(rank)`` says which slice of which parameter each rank owns.

    layout = FlatLayout([p.shape for p in params], world_size=4)
    flat = layout.flatten([p.data for p in params])   # padded with zeros
    mine = layout.shard(flat, rank)                    # a view: S elements
    views = layout.unflatten(flat)                     # per-parameter views into flat
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Piece:
    """The part of parameter ``index`` that lies in a rank's shard.

    ``param_start:param_end`` indexes the flattened parameter; ``shard_start`` is where that part
    begins inside the shard.
    """

    index: int
    param_start: int
    param_end: int
    shard_start: int

    @property
    def numel(self) -> int:
        return self.param_end - self.param_start


class FlatLayout:
    """Where each parameter sits in a flat buffer padded to ``world_size`` equal shards."""

    def __init__(self, shapes: Sequence[torch.Size | tuple], world_size: int, align: int = 1):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        if align < 1:
            raise ValueError(f"align must be >= 1, got {align}")
        self.shapes = [torch.Size(s) for s in shapes]
        self.numels = [math.prod(s) for s in self.shapes]
        self.offsets = [0]
        for n in self.numels:
            self.offsets.append(self.offsets[-1] + n)
        self.numel = self.offsets[-1]  # real elements
        self.world_size = world_size
        # Each shard is a multiple of ``align`` elements (e.g. for vectorized kernels), at least 1.
        self.shard_numel = max(1, math.ceil(self.numel / (world_size * align))) * align
        self.padded_numel = self.shard_numel * world_size

    @property
    def padding(self) -> int:
        return self.padded_numel - self.numel

    def shard_range(self, rank: int) -> tuple[int, int]:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside world_size {self.world_size}")
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def flatten(self, tensors: Sequence[torch.Tensor], dtype=None, device=None) -> torch.Tensor:
        """A new padded flat buffer holding ``tensors`` end to end (padding is zero)."""
        if len(tensors) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} tensors, got {len(tensors)}")
        first = tensors[0] if tensors else torch.empty(0)
        flat = torch.zeros(self.padded_numel, dtype=dtype or first.dtype, device=device or first.device)
        for t, shape, start, n in zip(tensors, self.shapes, self.offsets, self.numels):
            if t.shape != shape:
                raise ValueError(f"tensor of shape {tuple(t.shape)} where the layout has {tuple(shape)}")
            flat[start:start + n].copy_(t.reshape(-1))
        return flat

    def unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Per-parameter views into a full flat buffer (no copy)."""
        self._check_full(flat)
        return [flat[s:s + n].view(shape) for s, n, shape in zip(self.offsets, self.numels, self.shapes)]

    def shard(self, flat: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s shard of a full flat buffer, as a view."""
        self._check_full(flat)
        start, end = self.shard_range(rank)
        return flat[start:end]

    def pieces(self, rank: int) -> list[Piece]:
        """The parameter slices that fall inside rank ``rank``'s shard, in order."""
        lo, hi = self.shard_range(rank)
        out = []
        for i, (start, n) in enumerate(zip(self.offsets, self.numels)):
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                out.append(Piece(i, a - start, b - start, a - lo))
        return out

    def runs(self, labels: Sequence, rank: int | None = None) -> list[tuple[int, int, object]]:
        """``(start, end, label)`` runs covering rank ``rank``'s shard (``None``: the whole padded buffer),
        where parameter i carries ``labels[i]`` and neighbours with the same label merge; padding joins
        the run before it. The optimizer steps each run with its label's hyper-parameters."""
        if len(labels) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} labels, got {len(labels)}")
        if rank is None:
            size, spans = self.padded_numel, [(s, s + n, i) for i, (s, n) in enumerate(zip(self.offsets, self.numels))]
        else:
            size, spans = self.shard_numel, [(pc.shard_start, pc.shard_start + pc.numel, pc.index)
                                             for pc in self.pieces(rank)]
        out: list[list] = []
        for start, end, i in spans:
            if end > start:
                if out and out[-1][2] == labels[i]:
                    out[-1][1] = end
                else:
                    out.append([start, end, labels[i]])
        if not out:  # a shard of padding only
            return [(0, size, labels[0])]
        out[0][0], out[-1][1] = 0, size
        return [tuple(r) for r in out]

    def _check_full(self, flat: torch.Tensor) -> None:
        if flat.dim() != 1 or flat.numel() != self.padded_numel:
            raise ValueError(f"expected a flat buffer of {self.padded_numel} elements, got shape {tuple(flat.shape)}")

    def __repr__(self) -> str:
        return (f"FlatLayout({len(self.shapes)} tensors, {self.numel} elements + {self.padding} padding "
                f"= {self.world_size} × {self.shard_numel})")
