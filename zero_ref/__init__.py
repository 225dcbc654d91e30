"""zero_ref: a reference implementation of DeepSpeed-style ZeRO training on real torch.distributed.

`import zero_ref` and `import zero_ref.memory` do not import torch: the memory model, the
config schema and the rank-grid math are pure Python so the simulator (`sim`) can build on them.
Everything that needs torch is loaded on first use.
"""
from importlib import import_module

_MODULES = ("memory", "comm", "measure", "models", "precision", "flat", "optim", "stages", "batch", "zero_init",
            "offload", "nvme", "kernels")
__all__ = ["launch", "LaunchError", "RankError", "RankTimeout", *_MODULES]

_LAZY = {
    "launch": ("zero_ref.launcher", "launch"),
    "LaunchError": ("zero_ref.launcher", "LaunchError"),
    "RankError": ("zero_ref.launcher", "RankError"),
    "RankTimeout": ("zero_ref.launcher", "RankTimeout"),
}


def __getattr__(name):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(import_module(module), attr)
    if name in _MODULES:
        return import_module(f"zero_ref.{name}")
    raise AttributeError(f"module 'zero_ref' has no attribute {name!r}")
