"""Chapter 12's run of PyTorch's own collective debugging tools on real ranks.

``zero_ref.launch(torch_debug_tools, 2)`` runs it.
"""
from __future__ import annotations


def torch_debug_tools(rank, world):
    """An uneven all-reduce under TORCH_DISTRIBUTED_DEBUG=DETAIL, then monitored_barrier with rank 1 late:
    (the DETAIL error's message, rank 0's monitored_barrier error's first line or None)."""
    import datetime
    import os
    import time

    import torch
    import torch.distributed as dist

    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    dist.set_debug_level_from_env()                 # groups created from here on are wrapped
    detail = dist.new_group(list(range(world)))
    try:
        dist.all_reduce(torch.ones(3 - rank), group=detail)
    except RuntimeError as e:
        mismatch = str(e)
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "OFF"
    dist.set_debug_level_from_env()
    plain, late = dist.new_group(list(range(world))), None
    try:
        if rank == 1:
            time.sleep(2)                           # rank 1 is stuck elsewhere
        dist.monitored_barrier(group=plain, timeout=datetime.timedelta(seconds=1))
    except RuntimeError as e:
        late = str(e).splitlines()[0]
    return mismatch, late
