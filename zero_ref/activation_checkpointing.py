"""Activation checkpointing with DeepSpeed's API (``deepspeed.checkpointing``), on zero_ref.

Recomputing activations, not saving a run (that is ``zero_ref.checkpoint``). ``zero_ref.ds.checkpointing``
is this module under DeepSpeed's name, so scripts written for ``import deepspeed`` run unchanged:

    from zero_ref.ds import checkpointing
    checkpointing.configure(groups, partition_activations=True)   # or deepspeed_config=the JSON
    x = checkpointing.checkpoint(block, x)                        # keeps only x; reruns block in backward

``checkpoint(function, *args)`` runs ``function`` without recording a graph and keeps only its
tensor inputs. In backward it restores the RNG state the forward saw (so dropout draws the same
masks), runs ``function`` again with grad enabled and backpropagates through that fresh graph: the
same gradients as without checkpointing, for one more forward of the checkpointed part. A block
of Korthikanti's GPT then keeps its 2·s·b·h-byte input (16-bit) instead of 34·sbh + 5·a·s²·b.

What ``configure`` adds, as in DeepSpeed:

- ``partition_activations``: each of the t tensor-parallel ranks holds the same block input, so
  each keeps only its 1/t slice and the ranks all-gather it (``zero_ref.comm``, recorded) before
  the recompute;
- ``checkpoint_in_cpu`` (config: ``cpu_checkpointing``): the kept input is copied to host memory
  (pinned when there is a GPU) and copied back for the recompute. On a GPU that frees device
  memory for PCIe traffic; on a CPU-only machine host *is* the device, so it saves nothing: the
  copy is made anyway, and counted as the 'host' tier in ``stats()``, to show the mechanism;
- ``contiguous_checkpointing`` (config: ``contiguous_memory_optimization``): the partitions go into
  one preallocated buffer of ``num_checkpoints`` slots per argument (less fragmentation on GPUs);
- ``synchronize``: synchronize the GPU at each checkpoint boundary; ``profile``: the same, so the
  forward and recompute times in ``stats()`` are the kernels' times.

The mpu (DeepSpeed's "model parallel unit") names the group to partition over. Accepted: zero_ref's
``ParallelGroups`` (its tp group), a torch process group (taken as the tp group itself), or a
Megatron-style object with ``get_tensor_model_parallel_group()`` / ``get_model_parallel_group()``.
Like DeepSpeed, the settings are module-wide (``configure`` is called once per process, by the
script or by ``zero_ref.initialize`` when the config has an ``activation_checkpointing`` section).
"""
from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from zero_ref import comm, rng
from zero_ref.rng import RNGStatesTracker, get_rng_tracker, model_parallel_manual_seed

__all__ = ["configure", "configure_from_config", "checkpoint", "checkpoint_layers", "is_configured", "reset",
           "settings", "stats", "Stats", "RNGStatesTracker", "get_rng_tracker", "get_cuda_rng_tracker",
           "model_parallel_manual_seed", "model_parallel_cuda_manual_seed"]


@dataclass
class _Settings:
    partition: bool = False
    contiguous: bool = False
    num_checkpoints: int | None = None
    cpu: bool = False
    synchronize: bool = False
    profile: bool = False
    group: object = None        # the tensor-parallel group; None: nothing to partition over
    configured: bool = False


@dataclass
class Stats:
    """What checkpointing did since the last ``reset()``: calls, seconds, bytes kept per tier."""

    checkpoints: int = 0     # checkpointed forwards
    recomputes: int = 0      # forwards rerun in backward
    forward_s: float = 0.0
    recompute_s: float = 0.0
    saved_bytes: dict = field(default_factory=lambda: {"device": 0, "host": 0})


_settings, _stats = _Settings(), Stats()
_buffers: dict = {}          # contiguous_checkpointing: argument index -> [buffer, next free slot]


def _tp_group(mpu):
    if mpu is None or isinstance(mpu, dist.ProcessGroup):
        return mpu
    from zero_ref.parallel.groups import ParallelGroups
    if isinstance(mpu, ParallelGroups):
        return mpu.tp
    for getter in ("get_tensor_model_parallel_group", "get_model_parallel_group"):
        if hasattr(mpu, getter):
            return getattr(mpu, getter)()
    raise TypeError(f"configure: mpu_ must be zero_ref's ParallelGroups, a torch process group or an object with "
                    f"get_tensor_model_parallel_group() / get_model_parallel_group(); got {type(mpu).__name__}")


def configure(mpu_=None, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None) -> None:
    """Set activation checkpointing's options (DeepSpeed's signature). ``deepspeed_config`` (dict, JSON
    path or parsed ``Config``) gives its ``activation_checkpointing`` section; explicit arguments win.
    ``mpu_=None`` keeps the group of an earlier call, as DeepSpeed keeps its mpu."""
    global _settings
    from zero_ref.config import Config, parse
    s = _Settings(group=_tp_group(mpu_) if mpu_ is not None else _settings.group, configured=True)
    if deepspeed_config is not None:
        cfg = deepspeed_config if isinstance(deepspeed_config, Config) else parse(deepspeed_config)
        ac = cfg.activation_checkpointing
        s.partition, s.contiguous, s.num_checkpoints = (ac.partition_activations, ac.contiguous_memory_optimization,
                                                        ac.number_checkpoints)
        s.cpu, s.synchronize, s.profile = ac.cpu_checkpointing, ac.synchronize_checkpoint_boundary, ac.profile
    for name, value in (("partition", partition_activations), ("contiguous", contiguous_checkpointing),
                        ("num_checkpoints", num_checkpoints), ("cpu", checkpoint_in_cpu),
                        ("synchronize", synchronize), ("profile", profile)):
        if value is not None:
            setattr(s, name, value)
    if s.num_checkpoints is not None and (isinstance(s.num_checkpoints, bool) or not isinstance(s.num_checkpoints, int)
                                          or s.num_checkpoints < 1):
        raise ValueError(f"configure: num_checkpoints must be a positive integer, got {s.num_checkpoints!r}")
    if s.partition and s.group is None:
        raise ValueError("configure: partition_activations=True needs the tensor-parallel group to split over; "
                         "pass mpu_ (zero_ref's ParallelGroups, a process group, or an object with "
                         "get_model_parallel_group())")
    if s.contiguous and not s.partition:
        raise ValueError("configure: contiguous_checkpointing (contiguous_memory_optimization) works only with "
                         "partition_activations=True, as in DeepSpeed")
    if s.contiguous and s.num_checkpoints is None:
        raise ValueError("configure: contiguous_checkpointing needs num_checkpoints (number_checkpoints): the "
                         "number of checkpoints per forward, to size the buffer")
    _settings = s
    reset()


def configure_from_config(cfg, mpu_=None) -> list[str]:
    """``zero_ref.initialize``'s hook: configure from a parsed config's ``activation_checkpointing``
    section if it sets anything (a section of defaults changes nothing). Returns notes to print."""
    from zero_ref.config import ConfigError
    ac, key = cfg.activation_checkpointing, "activation_checkpointing"
    if ac == type(ac)():
        return []
    if ac.contiguous_memory_optimization and not ac.partition_activations:
        raise ConfigError(f"{key}.contiguous_memory_optimization", f"{key}.contiguous_memory_optimization needs "
                          "partition_activations: true (it stores the partitions; DeepSpeed asserts the same)")
    if ac.contiguous_memory_optimization and ac.number_checkpoints is None:
        raise ConfigError(f"{key}.number_checkpoints", f"{key}.number_checkpoints: missing; "
                          "contiguous_memory_optimization needs it (checkpoints per forward) to size its buffer")
    notes, partition = [], ac.partition_activations
    if partition and mpu_ is None and _settings.group is None:
        partition = False
        notes.append(f"{key}.partition_activations (and contiguous_memory_optimization) not applied: no "
                     "tensor-parallel group is known, so there is nothing to split over; call "
                     "zero_ref.ds.checkpointing.configure(mpu, deepspeed_config=...) with your groups")
    configure(mpu_, deepspeed_config=cfg, partition_activations=partition,
              contiguous_checkpointing=ac.contiguous_memory_optimization and partition)
    return notes


def is_configured() -> bool:
    """True once ``configure`` has been called (``checkpoint`` works without it, with the defaults)."""
    return _settings.configured


def reset() -> None:
    """Drop the contiguous buffers (DeepSpeed: call it after forwards without a backward) and the stats."""
    global _stats
    _buffers.clear()
    _stats = Stats()


def stats() -> Stats:
    return _stats


def settings() -> dict:
    """The options in force, under ``configure``'s argument names, and the size of the tp group."""
    s = _settings
    return {"partition_activations": s.partition, "contiguous_checkpointing": s.contiguous,
            "num_checkpoints": s.num_checkpoints, "checkpoint_in_cpu": s.cpu, "synchronize": s.synchronize,
            "profile": s.profile, "tp_size": dist.get_world_size(s.group) if s.group is not None else 1}


# ---------------------------------------------------------------- RNG (zero_ref.rng), under DeepSpeed's names

get_cuda_rng_tracker = get_rng_tracker


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """``rng.model_parallel_manual_seed`` over the configured tp group (DeepSpeed's name)."""
    model_parallel_manual_seed(seed, _settings.group)


# ---------------------------------------------------------------- what a checkpoint keeps

def _sync() -> None:
    if (_settings.synchronize or _settings.profile) and torch.cuda.is_available():
        torch.cuda.synchronize()


def _stash(i: int, t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """What is kept of input ``i`` (the tensor itself, this rank's 1/t slice, and/or a host copy) and
    whether it is a slice."""
    s, group = _settings, _settings.group
    n = dist.get_world_size(group) if s.partition else 1
    if not t.is_floating_point() or t.numel() < n:
        return t, False  # token ids, masks: kept whole (DeepSpeed's is_activation_to_checkpoint)
    kept, in_buffer = t.detach(), False
    if n > 1:
        size = -(-t.numel() // n)
        flat = torch.nn.functional.pad(kept.reshape(-1), (0, size * n - t.numel()))
        kept = flat[dist.get_rank(group) * size:][:size].clone()   # a storage of its own: 1/t of the bytes
        if s.contiguous:
            kept, in_buffer = _into_buffer(i, kept), True
    if s.cpu and not in_buffer:  # (the contiguous buffer is allocated on the host already)
        host = torch.empty(kept.shape, dtype=kept.dtype, pin_memory=torch.cuda.is_available())
        kept = host.copy_(kept)
    _stats.saved_bytes["host" if s.cpu else "device"] += kept.numel() * kept.element_size()
    return kept, n > 1


def _into_buffer(i: int, part: torch.Tensor) -> torch.Tensor:
    device = "cpu" if _settings.cpu else part.device
    if i not in _buffers:
        _buffers[i] = [torch.empty(_settings.num_checkpoints, part.numel(), dtype=part.dtype, device=device), 0]
    buf, slot = _buffers[i]
    if buf.shape[1] != part.numel() or buf.dtype != part.dtype:
        raise ValueError(f"contiguous_checkpointing: argument {i} has {part.numel()} {part.dtype} elements per rank, "
                         f"the buffer slots {buf.shape[1]} {buf.dtype}: it needs same-shape checkpoints")
    if slot == len(buf):
        raise RuntimeError(f"contiguous_checkpointing: more than num_checkpoints={len(buf)} checkpoints before a "
                           "backward; raise number_checkpoints, or call checkpointing.reset() after forwards "
                           "without backward")
    _buffers[i][1] += 1
    return buf[slot].copy_(part)


def _unstash(kept: torch.Tensor, like: tuple) -> torch.Tensor:
    shape, dtype, device, sliced = like
    if sliced:  # all-gather the t slices, drop the padding
        group = _settings.group
        full = torch.empty(kept.numel() * dist.get_world_size(group), dtype=dtype, device=device)
        comm.all_gather(full, kept.to(device), group=group)
        return full[:shape.numel()].view(shape)
    return kept.to(device, non_blocking=True).view(shape)


class CheckpointFunction(torch.autograd.Function):
    """Forward: ``run_function(*args)`` under no_grad, keeping only the (stashed) tensor inputs and the
    RNG states. Backward: restore the inputs and RNG states, rerun with grad, backprop its outputs."""

    @staticmethod
    def forward(ctx, run_function, n_out, *args):
        ctx.run_function = run_function
        ctx.tensor_at = [i for i, a in enumerate(args) if torch.is_tensor(a)]
        ctx.args = [None if torch.is_tensor(a) else a for a in args]
        ctx.needs_grad = [args[i].requires_grad for i in ctx.tensor_at]
        ctx.rng = rng.capture()
        _sync()
        start = time.perf_counter()
        with torch.no_grad():
            out = run_function(*args)
        _sync()
        _stats.forward_s += time.perf_counter() - start
        _stats.checkpoints += 1
        outs = _outputs(out)
        n_out.append(len(outs) if isinstance(out, (tuple, list)) else 0)
        kept = [_stash(k, args[i]) for k, i in enumerate(ctx.tensor_at)]
        ctx.like = [(args[i].shape, args[i].dtype, args[i].device, sliced)
                    for i, (_, sliced) in zip(ctx.tensor_at, kept)]
        ctx.save_for_backward(*(k for k, _ in kept))
        ctx.mark_non_differentiable(*(o for o in outs if not o.is_floating_point()))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("checkpoint: recomputation needs .backward(); torch.autograd.grad() is not supported")
        _buffers.clear()  # DeepSpeed drops the contiguous buffers at the first backward; saved slots stay alive
        args = list(ctx.args)
        for i, kept, like, req in zip(ctx.tensor_at, ctx.saved_tensors, ctx.like, ctx.needs_grad):
            args[i] = _unstash(kept, like).detach().requires_grad_(req)
        here = rng.capture()
        rng.restore(ctx.rng)
        _sync()
        start = time.perf_counter()
        try:
            with torch.enable_grad():
                outs = _outputs(ctx.run_function(*args))
        finally:
            rng.restore(here)
        _sync()
        _stats.recompute_s += time.perf_counter() - start
        _stats.recomputes += 1
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, *(a.grad if torch.is_tensor(a) else None for a in args))


def _outputs(out) -> tuple:
    if torch.is_tensor(out):
        return (out,)
    if isinstance(out, (tuple, list)) and out and all(torch.is_tensor(o) for o in out):
        return tuple(out)
    raise TypeError(f"checkpoint: the function must return a tensor or a non-empty tuple of tensors, got "
                    f"{type(out).__name__}{'' if not isinstance(out, (tuple, list)) else ' holding non-tensors'}")


def checkpoint(function, *args, **kwargs):
    """``function(*args, **kwargs)``, keeping only its inputs for backward (see the module docstring).
    Returns what ``function`` returns: a tensor or a tuple of tensors."""
    if not callable(function):
        raise TypeError(f"checkpoint: function must be callable, got {type(function).__name__}")
    if kwargs:  # keyword tensors take part like positional ones (DeepSpeed does the same)
        keys, n_pos, run = tuple(kwargs), len(args), function
        function = lambda *a: run(*a[:n_pos], **dict(zip(keys, a[n_pos:])))  # noqa: E731
        args = args + tuple(kwargs.values())
    if not torch.is_grad_enabled():
        return function(*args)  # nothing will be backpropagated: nothing to keep
    if not any(torch.is_tensor(a) and a.requires_grad for a in args):
        warnings.warn("checkpoint: no input requires grad, so the output will not either and the function's "
                      "parameters get no gradient (checkpoint a block whose input comes from a layer with "
                      "parameters, or call requires_grad_() on the input)", stacklevel=2)
    n_out: list = []
    outs = CheckpointFunction.apply(function, n_out, *args)
    return outs if n_out[0] else outs[0]


def checkpoint_layers(layers, count: int | None = None) -> int:
    """Checkpoint the first ``count`` modules of ``layers`` (all by default; the others run plainly):
    each one's forward goes through ``checkpoint``. State dicts are unchanged. Returns ``count``."""
    layers = list(layers)
    count = len(layers) if count is None else count
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= len(layers):
        raise ValueError(f"checkpoint_layers: count must be an integer in [0, {len(layers)}], got {count!r}")
    for i, layer in enumerate(layers):
        layer.__dict__.pop("forward", None)            # back to the class's forward
        if i < count:
            layer.forward = functools.partial(checkpoint, layer.forward)
    return count

