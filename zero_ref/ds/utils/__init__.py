"""``deepspeed.utils`` names that training scripts use: ``RepeatingLoader`` and ``logger``."""
import logging

from zero_ref.ds.runtime.dataloader import RepeatingLoader

__all__ = ["RepeatingLoader", "logger"]

logger = logging.getLogger("zero_ref")
