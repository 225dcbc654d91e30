"""``deepspeed.comm``: zero_ref's recorded collectives under DeepSpeed's names, and ``init_distributed``.

Every call goes through ``zero_ref.comm``, so ``comm.recording()`` counts it like any other.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from zero_ref.comm import (ReduceOp, all_gather, all_reduce, all_to_all, barrier, broadcast, destroy_process_group,
                           get_rank, get_world_size, hooked, irecv, is_available, is_initialized, isend, new_group,
                           recording, recv, reduce_scatter, send)

__all__ = ["ReduceOp", "all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "destroy_process_group",
           "get_rank", "get_world_size", "hooked", "irecv", "is_available", "is_initialized", "isend", "new_group",
           "recording", "recv", "reduce_scatter", "send", "init_distributed", "get_local_rank", "get_global_rank",
           "get_all_ranks_from_group", "get_world_group", "all_gather_into_tensor", "allgather_fn",
           "reduce_scatter_tensor", "reduce_scatter_fn", "all_to_all_single"]

all_gather_into_tensor = allgather_fn = all_gather
reduce_scatter_tensor = reduce_scatter_fn = reduce_scatter
all_to_all_single = all_to_all


def get_local_rank() -> int:
    """The launcher's LOCAL_RANK (torchrun, deepspeed), 0 without one."""
    return int(os.environ.get("LOCAL_RANK", 0))


def get_global_rank(group=None, group_rank: int = 0) -> int:
    return dist.get_global_rank(group or dist.group.WORLD, group_rank)


def get_all_ranks_from_group(group=None) -> list[int]:
    return dist.get_process_group_ranks(group or dist.group.WORLD)


def get_world_group():
    return dist.group.WORLD


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True, distributed_port: int = 29500,
                     verbose: bool = True, timeout=None, init_method: str | None = None,
                     dist_init_required: bool | None = None, config=None, rank: int = -1, world_size: int = -1) -> None:
    """Join torch.distributed unless joined (DeepSpeed's signature): from the launcher's environment
    (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or ``init_method`` with ``rank`` and
    ``world_size``, else as the only rank of a one-process group (no MPI discovery, no comm config)."""
    if dist.is_initialized():
        return
    if dist_init_required is False:
        raise RuntimeError("torch.distributed is not initialized and dist_init_required=False: call "
                           "torch.distributed.init_process_group first (or leave dist_init_required unset)")
    cuda = torch.cuda.is_available()
    backend = dist_backend or ("nccl" if cuda else "gloo")
    extra = {} if timeout is None else {"timeout": timeout}
    if init_method is not None and rank >= 0 and world_size > 0:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, **extra)
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(distributed_port))
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, init_method=init_method, **extra)
    else:  # `python train.py` without a launcher: one rank, no network
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **extra)
