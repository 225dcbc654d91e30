"""zero_ref: a reference implementation of DeepSpeed-style ZeRO training on real torch.distributed.

`import zero_ref` and `import zero_ref.memory` do not import torch: the memory model, the
config schema and the rank-grid math are pure Python so the simulator (`sim`) can build on them.
Everything that needs torch is loaded on first use. DeepSpeed's API lives in the `ds` wing:
`import zero_ref.ds as deepspeed` is the one-line swap for a DeepSpeed script.
"""
from importlib import import_module

#: The DeepSpeed release whose API and config zero_ref follows (as ``zero_ref.ds.__version__``);
#: zero_ref's own version is ``importlib.metadata.version("zero-lab")``.
__version__ = "0.19.8"

#: The wings and modules of the package, loaded on first use.
MODULES = ("activation_checkpointing", "checkpoint", "clean_exit", "collective_algorithms", "comm", "compression",
           "config", "diagnostics", "ds", "forkserver", "kernels", "launch_rank", "launcher", "measure", "memory",
           "models", "offload", "optim", "parallel", "precision", "profiling", "recipes", "rng", "stages")

_LAZY = {
    "launch": ("zero_ref.launcher", "launch"),
    "LaunchError": ("zero_ref.launcher", "LaunchError"),
    "RankError": ("zero_ref.launcher", "RankError"),
    "RankTimeout": ("zero_ref.launcher", "RankTimeout"),
    # DeepSpeed's entry points, from the ds wing
    "initialize": ("zero_ref.ds", "initialize"),
    "init_distributed": ("zero_ref.ds", "init_distributed"),
    "add_config_arguments": ("zero_ref.ds", "add_config_arguments"),
    "tp_model_init": ("zero_ref.ds", "tp_model_init"),
    "init_inference": ("zero_ref.ds", "init_inference"),
    "zero": ("zero_ref.ds", "zero"),
    "checkpointing": ("zero_ref.ds", "checkpointing"),
}

__all__ = ["launch", "LaunchError", "RankError", "RankTimeout", "initialize", "init_distributed",
           "add_config_arguments", "tp_model_init", "init_inference", "zero", "checkpointing", "__version__",
           *MODULES]


def __getattr__(name):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return import_module(module) if attr is None else getattr(import_module(module), attr)
    if name in MODULES:
        return import_module(f"zero_ref.{name}")
    raise AttributeError(f"module 'zero_ref' has no attribute {name!r}")
