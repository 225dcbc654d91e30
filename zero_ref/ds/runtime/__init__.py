"""DeepSpeed's ``deepspeed.runtime`` names that training scripts import (``runtime.utils``, ``runtime.dataloader``)."""
