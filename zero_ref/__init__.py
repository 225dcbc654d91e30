"""zero_ref: a reference implementation of DeepSpeed-style ZeRO training on real torch.distributed.

`import zero_ref` and `import zero_ref.memory` do not import torch: the memory model, the
config schema and the rank-grid math are pure Python so the simulator (`sim`) can build on them.
Everything that needs torch is loaded on first use.
"""
import pkgutil
from importlib import import_module

from zero_ref import _moved

_moved.install()

# Every module and wing of the package, read from the folder so that none is left out.
_MODULES = tuple(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
#: The DeepSpeed release whose API and config zero_ref follows (scripts gate features on
#: ``deepspeed.__version__``); zero_ref's own version is ``importlib.metadata.version("zero-lab")``.
__version__ = "0.19.8"

__all__ = ["launch", "LaunchError", "RankError", "RankTimeout", "initialize", "init_distributed",
           "add_config_arguments", "tp_model_init", "init_inference", "zero", "checkpointing",
           *_MODULES]

_LAZY = {
    "launch": ("zero_ref.launcher", "launch"),
    "LaunchError": ("zero_ref.launcher", "LaunchError"),
    "RankError": ("zero_ref.launcher", "RankError"),
    "RankTimeout": ("zero_ref.launcher", "RankTimeout"),
    # DeepSpeed's entry points, so a script runs with `import zero_ref as ds` or `import deepspeed as ds`.
    "initialize": ("zero_ref.engine", "initialize"),
    "init_distributed": ("zero_ref.engine", "init_distributed"),
    "add_config_arguments": ("zero_ref.engine", "add_config_arguments"),
    "tp_model_init": ("zero_ref.engine", "tp_model_init"),
    "init_inference": ("zero_ref.engine", "init_inference"),
    "zero": ("zero_ref.stages.zero3", None),  # ds.zero.Init / ds.zero.GatheredParameters
    "checkpointing": ("zero_ref.activation_checkpointing", None),  # ds.checkpointing.checkpoint / configure
}


def __getattr__(name):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return import_module(module) if attr is None else getattr(import_module(module), attr)
    if name in _MODULES or f"zero_ref.{name}" in _moved.MOVED:
        return import_module(f"zero_ref.{name}")
    raise AttributeError(f"module 'zero_ref' has no attribute {name!r}")
