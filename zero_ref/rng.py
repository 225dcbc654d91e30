"""RNG states for model parallelism and recomputation (DeepSpeed's and Megatron's RNG tracker).

Two needs, one file:

- A recomputed forward must draw the *same* random numbers as the first one (dropout masks), or
  the gradients belong to a different function. ``capture()`` takes every generator's state (the
  CPU's, the current GPU's, and the tracker's named states); ``restore(state)`` puts them back.
- Under tensor parallelism, dropout in a region each rank computes a different part of (its
  attention heads) should draw different masks per tp rank, while dropout on replicated
  activations must draw the same masks everywhere. ``RNGStatesTracker`` keeps named generator
  states; code that needs the per-rank stream runs inside ``tracker.fork()``.
  ``model_parallel_manual_seed(seed, group)`` seeds the default generator with ``seed`` (equal on
  the tp ranks) and the tracker's "model-parallel-rng" with seed + 2718 + tp rank, as DeepSpeed does.

"The device" is the GPU when there is one, else the CPU (whose generator dropout then uses).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

__all__ = ["MODEL_PARALLEL_RNG", "RNGStatesTracker", "get_rng_tracker", "model_parallel_manual_seed",
           "capture", "restore"]

MODEL_PARALLEL_RNG = "model-parallel-rng"  # DeepSpeed's (and Megatron's) name


def _device_rng():
    return torch.cuda if torch.cuda.is_available() else torch.random


class RNGStatesTracker:
    """Named states of the device's generator (DeepSpeed's ``CudaRNGStatesTracker``)."""

    def __init__(self):
        self.states, self.seeds = {}, set()

    def reset(self) -> None:
        self.states, self.seeds = {}, set()

    def get_states(self) -> dict:
        return dict(self.states)

    def set_states(self, states: dict) -> None:
        self.states = dict(states)

    def add(self, name: str, seed: int) -> None:
        """A new state ``name``: the generator as seeded with ``seed`` (the current state is left alone)."""
        if seed in self.seeds or name in self.states:
            raise ValueError(f"RNGStatesTracker.add: seed {seed} or state {name!r} already exists")
        self.seeds.add(seed)
        before = _device_rng().get_rng_state()
        _device_rng().manual_seed(seed)
        self.states[name] = _device_rng().get_rng_state()
        _device_rng().set_rng_state(before)

    @contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG):
        """Draw from state ``name`` inside the block; it advances, and the default state is untouched."""
        if name not in self.states:
            raise KeyError(f"RNGStatesTracker.fork: no state {name!r}; add it first (model_parallel_manual_seed)")
        before = _device_rng().get_rng_state()
        _device_rng().set_rng_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = _device_rng().get_rng_state()
            _device_rng().set_rng_state(before)


_TRACKER = RNGStatesTracker()


def get_rng_tracker() -> RNGStatesTracker:
    """The process's tracker (one per process, as in DeepSpeed)."""
    return _TRACKER


def model_parallel_manual_seed(seed: int, group=None) -> None:
    """Seed the default generator with ``seed`` and the tracker's model-parallel state with
    seed + 2718 + this rank's index in ``group`` (the tp group; None: index 0)."""
    tp_rank = dist.get_rank(group) if group is not None else 0
    _device_rng().manual_seed(seed)
    _TRACKER.reset()
    _TRACKER.add(MODEL_PARALLEL_RNG, seed + 2718 + tp_rank)


def capture() -> tuple:
    """Every generator state a forward may draw from: CPU, current GPU (if any), the tracker's."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    return torch.get_rng_state(), cuda, _TRACKER.get_states()


def restore(state: tuple) -> None:
    """Put back what ``capture()`` returned."""
    cpu, cuda, tracked = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)
    _TRACKER.set_states(tracked)
