"""``deepspeed.utils.logging.logger``: the logger DeepSpeed's scripts and transformers write to (zero_ref's)."""
import logging

__all__ = ["logger"]

logger = logging.getLogger("zero_ref")
