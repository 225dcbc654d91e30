"""Which routine gloo's worker thread runs for each c10d collective, as torch.profiler names it."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from zero_ref import comm


def profile_gloo_routines(world: int, numel: int = 1 << 16) -> list[str]:
    """The ``gloo:*`` profiler events of one all-reduce, one reduce-scatter and one all-gather, in time order."""
    full, shard = torch.ones(numel), torch.ones(numel // world)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        comm.all_reduce(full)
        comm.reduce_scatter(shard, full)
        comm.all_gather(full, shard)
    events = sorted((e.time_range.start, e.name) for e in prof.events() if e.name.startswith("gloo:"))
    return [name for _, name in events]
