"""What rank r owns of one bucket (or ZeRO-3 unit): ZeRO's 1/N, as one object.

Every stage keeps, per bucket, the fp32 weights the optimizer updates, the two Adam moments, and
(stage 2 and up, or with offload) the reduced gradient that accumulates between steps, all for the
same range of the bucket's flat buffer:

    part = bucket.partition
    part.start, part.end                 # this rank's range of the flat buffer (stage 0: all of it)
    part.master, part.exp_avg, part.exp_avg_sq, part.grad

The stage builds it (``ZeroOptimizerBase.new_partition``); offload only moves its tensors
(``OptimizerOffload.place``: to the host; ``attach``: into NVMe files, leaving ``None`` here).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Partition:
    """This rank's share of one bucket: fp32 master, Adam moments and gradient for ``[start, end)``."""

    start: int                       # this rank's range in the bucket's flat (padded) buffer
    end: int
    master: torch.Tensor | None      # fp32 weights (in fp32 training, the flat parameter's own slice)
    exp_avg: torch.Tensor | None     # Adam's first moment (None while it lives in an NVMe file)
    exp_avg_sq: torch.Tensor | None  # Adam's second moment
    grad: torch.Tensor | None        # the reduced gradient shard (stages 2-3, offload); stages 0-1: in flat_grad

    @property
    def numel(self) -> int:
        return self.end - self.start

    def optimizer_tensors(self) -> list[torch.Tensor]:
        """Master and moments, those held in memory (NVMe keeps them in files)."""
        return [t for t in (self.master, self.exp_avg, self.exp_avg_sq) if t is not None]
