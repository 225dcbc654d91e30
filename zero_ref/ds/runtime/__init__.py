"""DeepSpeed's ``deepspeed.runtime`` names that training scripts import (``runtime.utils``, ``runtime.dataloader``).

Submodules load on first use as attributes too (``deepspeed.runtime.utils.set_random_seed`` after a bare
``import deepspeed``, as DeepSpeed's own package has imported them), so ``runtime.lr_schedules`` stays torch-free.
"""
from importlib import import_module


def __getattr__(name):
    try:
        return import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
