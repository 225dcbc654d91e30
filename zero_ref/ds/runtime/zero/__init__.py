"""``deepspeed.runtime.zero``, which DeepSpeed also exports as ``deepspeed.zero``."""
from zero_ref.ds.zero import GatheredParameters, Init, register_external_parameter, unregister_external_parameter

__all__ = ["Init", "GatheredParameters", "register_external_parameter", "unregister_external_parameter"]
