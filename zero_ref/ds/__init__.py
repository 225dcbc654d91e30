"""DeepSpeed's API over zero_ref, laid out as DeepSpeed 0.19.8's package.

``import zero_ref.ds as deepspeed`` is the one-line swap for a DeepSpeed script: ``deepspeed.initialize``,
``deepspeed.comm``, ``deepspeed.zero.Init``, ``deepspeed.pipe.PipelineModule``, ``deepspeed.ops.adam`` and
the rest resolve here (``zero_ref.ds.X`` is ``deepspeed.X``). Everything in this wing exists to match
DeepSpeed; the ideas it is built from live in the rest of zero_ref.
"""
from zero_ref.ds import checkpointing, comm, zero
from zero_ref.ds.comm import init_distributed
from zero_ref.ds.compat import add_config_arguments, init_inference, tp_model_init
from zero_ref.ds.engine import initialize

#: The DeepSpeed release whose API and config zero_ref follows (scripts gate features on ``deepspeed.__version__``).
__version__ = "0.19.8"

__all__ = ["initialize", "init_distributed", "add_config_arguments", "tp_model_init", "init_inference", "zero",
           "checkpointing", "comm", "__version__"]
