"""Measure memory by counting tensor storage: model states by category, and saved activations.

Chapter 2 holds these numbers against the formulas of ``zero_ref.memory``. We count bytes of
tensor *storage* (``untyped_storage().nbytes()``), not RSS or allocator statistics, because
that is exactly what the formulas describe, and it works the same on CPU and GPU:

- each storage is counted once: tied weights are one storage, a view (slice, transpose,
  ``.view``) shares its base's storage, and a flat ZeRO buffer with parameters viewing into it
  is counted once, whole;
- a tensor that views part of a larger storage holds the whole storage alive, so the whole
  storage is what it costs.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator, NamedTuple

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


def storage_key(t: torch.Tensor) -> tuple:
    """Identifies a tensor's storage: views of one storage share it, distinct live storages differ."""
    st = t.untyped_storage()
    # Empty storages may all sit at address 0; they hold no bytes, so any distinct key will do.
    return (t.device.type, t.device.index, st.data_ptr() if st.nbytes() else ("empty", id(st)))


def _count_new(tensors: Iterable[torch.Tensor], seen: set) -> int:
    """Bytes of the storages in ``tensors`` not yet in ``seen`` (which it updates)."""
    total = 0
    for t in tensors:
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def unique_storage_bytes(tensors: Iterable[torch.Tensor], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages behind ``tensors``, skipping those of ``exclude``."""
    return _count_new(tensors, {storage_key(t) for t in exclude})


def cuda_requested_bytes() -> int:
    """Bytes the live CUDA tensors asked for: on a GPU, what ``unique_storage_bytes`` counts of them all.

    ``torch.cuda.memory_allocated`` counts the allocator's blocks instead, which can be up to 1 MiB
    larger than asked (a cached block whose rest is too small to split off), and includes what torch
    allocates for itself, such as cuBLAS's workspace on the first matrix product of a stream."""
    return torch.cuda.memory_stats().get("requested_bytes.all.current", torch.cuda.memory_allocated())


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes held by a model (and optimizer), by category; each storage counted once, in one category."""

    params: int
    grads: int
    optimizer_states: int  # per-parameter-sized state: Adam's exp_avg, exp_avg_sq, master copies
    optimizer_other: int   # everything else the optimizer holds, e.g. AdamW's per-parameter `step`
    buffers: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer_states + self.optimizer_other + self.buffers

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def memory_by_category(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> MemoryBreakdown:
    """Sum the storage bytes of ``model``'s parameters, gradients and buffers and ``optimizer``'s state.

    Model first, then optimizer: a storage counted as a parameter, gradient or buffer is not
    counted again. An optimizer tensor is a *state* when it has as many elements as its parameter
    (Adam moments, fp32 master weights) and *other* otherwise (0-d ``step`` counters, scalars).
    Parameters the optimizer steps that the model does not hold (fp32 masters of a 16-bit model)
    count as optimizer states, and their gradients as gradients.
    """
    seen: set = set()
    model_params = list(model.parameters())  # nn.Module already de-duplicates tied Parameters
    opt_params = [p for g in optimizer.param_groups for p in g["params"]] if optimizer else []
    params = _count_new(model_params, seen)
    grads = _count_new((p.grad for p in model_params + opt_params if p.grad is not None), seen)
    buffers = _count_new(model.buffers(), seen)
    states = list(opt_params)  # model parameters among them are already in `seen`
    other = []
    for p, state in (optimizer.state.items() if optimizer else ()):
        for name, v in state.items():
            if isinstance(v, torch.Tensor):
                # "step" by name too: for a one-element parameter the counter has its numel.
                per_param = v.numel() == p.numel() and name != "step"
                (states if per_param else other).append(v)
    return MemoryBreakdown(params=params, grads=grads, optimizer_states=_count_new(states, seen),
                           optimizer_other=_count_new(other, seen), buffers=buffers)


class SavedTensor(NamedTuple):
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int  # bytes of its whole storage (the storage is what stays alive)


@dataclass
class SavedActivations:
    """What autograd saved for backward: ``items`` in save order (each storage once), ``total`` bytes."""

    items: list[SavedTensor] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(i.nbytes for i in self.items)

    def table(self) -> str:
        rows = [f"{'shape':<24}{'dtype':<16}{'bytes':>12}"]
        rows += [f"{str(tuple(i.shape)):<24}{str(i.dtype):<16}{i.nbytes:>12,}" for i in self.items]
        return "\n".join(rows + [f"{'total':<40}{self.total:>12,}"])


@contextmanager
def saved_activation_bytes(*exclude: nn.Module | torch.Tensor) -> Iterator[SavedActivations]:
    """Record every tensor autograd saves for backward inside the ``with`` block.

    Parameters are model state, not activations: an ``nn.Parameter`` or a view of one (a linear
    layer saves ``weight.t()``) is skipped, and so is any tensor sharing storage with a parameter
    or buffer of a module in ``exclude`` (or with a tensor in ``exclude``) — pass the model to also
    skip e.g. the 16-bit weight copies some code paths make. Each storage is counted once, in
    the order it was first saved. Typical use::

        with saved_activation_bytes(model) as acts:
            loss = model(idx, targets)[1]
        print(acts.table())

    The recorder holds a reference to each storage it counted until the block exits, so a freed
    storage's address can't be reused and mistaken for one already seen. Saved-tensor hooks don't
    nest: inside this block, activation checkpointing's own hooks take over what they cover.
    """
    result = SavedActivations()
    skip: set = set()
    for obj in exclude:
        tensors = [*obj.parameters(), *obj.buffers()] if isinstance(obj, nn.Module) else [obj]
        skip.update(storage_key(t) for t in tensors)
    held: dict = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        is_param = isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter)
        key = storage_key(t)
        if not is_param and key not in skip and key not in held:
            st = t.untyped_storage()
            held[key] = st
            result.items.append(SavedTensor(tuple(t.shape), t.dtype, st.nbytes()))
        return t  # keep the tensor as autograd would; we only look

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield result
    finally:
        held.clear()


class PeakTensorBytes(TorchDispatchMode):
    """Bytes of tensor storage allocated inside the block and still alive; ``peak`` is their maximum.

    For what a *piece of code* allocates on the way, e.g. building a model whole against building
    it under ``zero3.Init``, which the tensors left at the end don't show. Every op's result
    whose storage is not one of the op's inputs and not already counted is a new storage (so a view
    or an in-place op adds nothing); it counts in ``live`` until the storage is freed::

        with PeakTensorBytes() as m:
            model = GPT(cfg)
        print(m.peak, m.live)

    Only tensors made by torch ops inside the block count; storages made before it, or outside
    the dispatcher, are not seen.
    """

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._keys: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {storage_key(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st, key = t.untyped_storage(), storage_key(t)
                if st.nbytes() and key not in inputs and key not in self._keys:
                    self._keys.add(key)
                    self.live += st.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(st, self._free, key, st.nbytes())
        return out

    def _free(self, key, nbytes: int) -> None:
        self._keys.discard(key)
        self.live -= nbytes
