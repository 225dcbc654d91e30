"""``deepspeed.zero``: build a model already partitioned (``Init``) and gather parameters for a block."""
from zero_ref.stages.zero3 import (GatheredParameters, Init, register_external_parameter,
                                   unregister_external_parameter)

__all__ = ["Init", "GatheredParameters", "register_external_parameter", "unregister_external_parameter"]
