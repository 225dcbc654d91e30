"""``deepspeed.utils.module_utils``: submodules by dotted path (DeepSpeed-Chat's LoRA code uses them)."""
from __future__ import annotations

import torch.nn as nn

__all__ = ["recursive_getattr", "recursive_setattr"]


def recursive_getattr(model: nn.Module, module_name: str):
    """The submodule at the dotted path ``module_name`` (``"encoder.layer.0"``)."""
    obj = model
    for part in module_name.split("."):
        obj = getattr(obj, part)
    return obj


def recursive_setattr(model: nn.Module, module_name: str, module) -> None:
    """Put ``module`` at the dotted path ``module_name``."""
    parent, _, last = module_name.rpartition(".")
    setattr(recursive_getattr(model, parent) if parent else model, last, module)
