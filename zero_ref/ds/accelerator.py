"""``get_accelerator()``: the part of DeepSpeed's accelerator API that training scripts call.

DeepSpeed scripts ask ``deepspeed.accelerator.get_accelerator()`` where to put tensors, which backend to
join and how to seed, instead of naming CUDA. This answers as DeepSpeed's CUDA accelerator does on a
GPU machine and as its CPU accelerator does on a CPU one (deepspeed/accelerator/cuda_accelerator.py,
cpu_accelerator.py), for the calls below; ``current_device()`` is an int on the CPU too (DeepSpeed's
CPU accelerator returns the LOCAL_RANK string when it is set).
"""
from __future__ import annotations

import os

import torch

__all__ = ["Accelerator", "get_accelerator"]


class Accelerator:
    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self._name = "cuda" if self.cuda else "cpu"

    # -------------------------------------------------------------- devices
    def device_name(self, device_index: int | None = None) -> str:
        return self._name if device_index is None or not self.cuda else f"cuda:{device_index}"

    def device(self, device_index: int | None = None):
        return torch.cuda.device(device_index) if self.cuda else None

    def set_device(self, device_index: int) -> None:
        if self.cuda:
            torch.cuda.set_device(device_index)

    def current_device(self) -> int:
        return torch.cuda.current_device() if self.cuda else int(os.environ.get("LOCAL_RANK", 0))

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}" if self.cuda else "cpu"

    def device_count(self) -> int:
        return torch.cuda.device_count() if self.cuda else int(os.environ.get("LOCAL_SIZE", 1))

    def is_available(self) -> bool:
        return True

    def synchronize(self, device_index: int | None = None) -> None:
        if self.cuda:
            torch.cuda.synchronize(device_index)

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    # -------------------------------------------------------------- the rest a training loop asks
    def communication_backend_name(self) -> str:
        return "nccl" if self.cuda else "gloo"

    def manual_seed(self, seed: int):
        return torch.manual_seed(seed)  # seeds every CUDA device too

    manual_seed_all = manual_seed

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self.cuda else True

    def is_fp16_supported(self) -> bool:
        if self.cuda:
            return True
        try:  # DeepSpeed's CPU accelerator: fp16 only where oneDNN has it
            return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except Exception:  # noqa: BLE001 - an op missing from this build means no
            return False

    def empty_cache(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()

    def memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_allocated(device_index) if self.cuda else 0

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_allocated(device_index) if self.cuda else 0

    def memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_reserved(device_index) if self.cuda else 0

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_reserved(device_index) if self.cuda else 0

    def reset_peak_memory_stats(self, device_index: int | None = None) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device_index)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory() if self.cuda else tensor


_accelerator: Accelerator | None = None


def get_accelerator() -> Accelerator:
    global _accelerator
    if _accelerator is None:
        _accelerator = Accelerator()
    return _accelerator
