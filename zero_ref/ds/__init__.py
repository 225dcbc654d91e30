"""DeepSpeed's API over zero_ref, laid out as DeepSpeed 0.19.8's package.

``import zero_ref.ds as deepspeed`` is the one-line swap for a DeepSpeed script: ``deepspeed.initialize``,
``deepspeed.comm``, ``deepspeed.zero.Init``, ``deepspeed.pipe.PipelineModule``, ``deepspeed.ops.adam`` and
the rest resolve here (``zero_ref.ds.X`` is ``deepspeed.X``). Everything in this wing exists to match
DeepSpeed; the ideas it is built from live in the rest of zero_ref. Names load on first use, so the
torch-free ``runtime.lr_schedules`` stays torch-free.
"""
from importlib import import_module

#: The DeepSpeed release whose API and config zero_ref follows (scripts gate features on ``deepspeed.__version__``).
__version__ = "0.19.8"

_LAZY = {
    "initialize": ("zero_ref.ds.engine", "initialize"),
    "init_distributed": ("zero_ref.ds.comm", "init_distributed"),
    "add_config_arguments": ("zero_ref.ds.compat", "add_config_arguments"),
    "tp_model_init": ("zero_ref.ds.compat", "tp_model_init"),
    "init_inference": ("zero_ref.ds.compat", "init_inference"),
    "zero": ("zero_ref.ds.zero", None),
    "checkpointing": ("zero_ref.ds.checkpointing", None),
    "comm": ("zero_ref.ds.comm", None),
    "DeepSpeedEngine": ("zero_ref.ds.engine", "Engine"),
    "PipelineEngine": ("zero_ref.ds.pipe", "PipelineEngine"),
    "PipelineModule": ("zero_ref.ds.pipe", "PipelineModule"),
    "get_accelerator": ("zero_ref.ds.accelerator", "get_accelerator"),
    "logger": ("zero_ref.ds.utils.logging", "logger"),
}

__all__ = ["initialize", "init_distributed", "add_config_arguments", "tp_model_init", "init_inference", "zero",
           "checkpointing", "comm", "DeepSpeedEngine", "PipelineEngine", "PipelineModule", "get_accelerator", "logger",
           "__version__"]


def __getattr__(name):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return import_module(module) if attr is None else getattr(import_module(module), attr)
    try:
        return import_module(f"zero_ref.ds.{name}")  # deepspeed.pipe, deepspeed.ops, ... as attributes
    except ModuleNotFoundError as e:
        if e.name != f"zero_ref.ds.{name}":
            raise
        raise AttributeError(f"module 'zero_ref.ds' has no attribute {name!r}") from None
