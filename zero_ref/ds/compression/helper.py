"""``deepspeed.compression.helper``: DeepSpeed 0.19.8 keeps only these two names here, from ``utils.module_utils``."""
from zero_ref.ds.utils.module_utils import recursive_getattr, recursive_setattr

__all__ = ["recursive_getattr", "recursive_setattr"]
