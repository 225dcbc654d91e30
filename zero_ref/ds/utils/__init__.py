"""``deepspeed.utils`` names that training scripts use: ``RepeatingLoader`` and ``logger``."""
from zero_ref.ds.runtime.dataloader import RepeatingLoader
from zero_ref.ds.utils.logging import logger

__all__ = ["RepeatingLoader", "logger"]
