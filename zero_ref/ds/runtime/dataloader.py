"""``deepspeed.runtime.dataloader.RepeatingLoader`` (also ``deepspeed.utils.RepeatingLoader``)."""
from __future__ import annotations

__all__ = ["RepeatingLoader"]


class RepeatingLoader:
    """An iterator over ``loader`` that starts again when it ends (pipeline scripts feed train_batch with it)."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)
