"""The ``deepspeed.runtime.utils`` functions that training scripts call, with DeepSpeed's signatures.

``set_random_seed`` (random, numpy, torch), ``move_to_device`` (nested lists, tuples, dicts),
``see_memory_usage`` (prints on rank 0 when ``force``: the accelerator's bytes where there is one, and the
process's resident memory), and DeepSpeed's layer splits ``partition_uniform`` / ``partition_balanced``
(zero_ref.ds.pipe). Other names of that module are DeepSpeed's internals and are not provided.
"""
from __future__ import annotations

import gc
import random
import resource
import sys

import torch
import torch.distributed as dist

from zero_ref.ds.pipe.module import partition_balanced, partition_uniform

__all__ = ["set_random_seed", "move_to_device", "see_memory_usage", "partition_uniform", "partition_balanced"]


def set_random_seed(seed: int) -> None:
    """Seed Python's, numpy's and torch's generators, as DeepSpeed's does (numpy takes the seed mod 2**32)."""
    import numpy

    random.seed(seed)
    numpy.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed % (2 ** 63))


def move_to_device(item, device, criterion_func=None):
    """``item`` (a tensor, or lists / tuples / dicts of them) on ``device``; with ``criterion_func``, a tensor it
    accepts is moved in place (its ``.data`` replaced), as in DeepSpeed."""
    if criterion_func is not None and criterion_func(item):
        item.data = item.to(device).data
        return item
    if isinstance(item, list):
        return [move_to_device(v, device, criterion_func) for v in item]
    if isinstance(item, tuple):
        return tuple(move_to_device(v, device, criterion_func) for v in item)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    return item.to(device)


def see_memory_usage(message: str, force: bool = False) -> None:
    """Print ``message`` and the memory in use, on rank 0 only, when ``force`` (DeepSpeed prints nothing otherwise)."""
    if not force or (dist.is_initialized() and dist.get_rank() != 0):
        return
    gc.collect()
    print(message)
    gib = 1024 ** 3
    if torch.cuda.is_available():
        print(f"MA {torch.cuda.memory_allocated() / gib:.2f} GB  Max_MA {torch.cuda.max_memory_allocated() / gib:.2f} GB  "
              f"CA {torch.cuda.memory_reserved() / gib:.2f} GB  Max_CA {torch.cuda.max_memory_reserved() / gib:.2f} GB")
        torch.cuda.reset_peak_memory_stats()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    print(f"CPU: peak resident memory of this process = {peak / gib:.2f} GB")
