"""Partitioned parameters (DeepSpeed's ``partition_parameters.py``): ``Unit``, ``Init``, ``GatheredParameters``.

A ``Unit`` is a group of parameters partitioned together: rank r keeps shard r of their flat padded
buffer (``unit.part``) and ``param.data`` is empty until ``unit.gather()`` (an all-gather; the
parameters become views into the full buffer) and again after ``unit.release()``. ZeroStage3
(zero_ref/stages/zero3.py) decides when; this module builds units and gathers them on request:

    with zero_init.Init():
        model = GPT(cfg)        # each module is partitioned as soon as its own __init__ returns
    opt = ZeroStage3(model)     # adopts those partitions as its units (no gather)
    with zero_init.GatheredParameters(model.ln_f.parameters(), modifier_rank=0):
        if rank == 0:
            model.ln_f.weight.fill_(1.0)   # broadcast from rank 0 and re-partitioned on exit

Inside the block, as in DeepSpeed's ``partition_parameters.py``, the ``__init__`` of every
``nn.Module`` subclass (and of subclasses defined inside the block) is wrapped: when the outermost
``__init__`` of an object returns, that module's own parameters (``recurse=False``) become one
``Unit``: this rank keeps its shard and ``param.data`` becomes empty. And
``module.apply(fn)`` gathers each module's own parameters around ``fn(module)``, then keeps this
rank's shard of the result. A rank's peak is therefore its shards of everything built so far plus
the full parameters of the one module being built (the largest unit).

"Same initial values": every initializer still runs on the full tensor, in the same order and
drawing the same random numbers as a normal build (a module's ``reset_parameters`` inside its
``__init__`` before it is partitioned, ``apply`` with the parameters gathered). So with the same
torch seed on every rank, the shards hold bit for bit the values of the model built without
``Init``, and training them gives the same result. Each module's parameters are broadcast from the
group's first rank before they are partitioned, as DeepSpeed's ``_zero_init_param`` does, so ranks
seeded differently still build one model (rank 0's). An initializer run
elsewhere (``model.reset_parameters()`` after the block) sees empty tensors: wrap it in
``GatheredParameters(..., modifier_rank=0)``.

``apply`` broadcasts rank 0's result before re-partitioning, as DeepSpeed's does.

Simplified vs DeepSpeed: no tensor-creation overrides (device/dtype), no meta/``skip_init``
handling, no remote (CPU/NVMe) device.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from zero_ref import comm
from zero_ref.stages.flat import FlatLayout

__all__ = ["Unit", "Init", "GatheredParameters", "register_external_parameter", "unregister_external_parameter"]


class Unit:
    """Parameters partitioned together: rank r keeps shard r (``part``) of their flat padded buffer."""

    def __init__(self, name: str, params: list[nn.Parameter], group=None):
        self.name, self.params, self.group = name, params, group
        self.rank = dist.get_rank(group)
        self.device = params[0].device  # where the gathered parameters compute
        self.offload = None  # a ``zero_ref.offload.ParamOffload`` when ``part`` lives on the host or in a file
        self.layout = FlatLayout([p.shape for p in params], dist.get_world_size(group))
        self.part = torch.zeros(self.layout.shard_numel, dtype=params[0].dtype, device=params[0].device)
        for pc in self.layout.pieces(self.rank):  # copy just our slices: no full flat copy is made
            self.part[pc.shard_start:pc.shard_start + pc.numel] = \
                params[pc.index].detach().reshape(-1)[pc.param_start:pc.param_end]
        self.full = self.work = None  # the gathered buffer (None when released); an all-gather in flight
        # other copies of this rank's shard, kept up to date by repartition(): a stage's fp32 master
        self.on_repartition: list[Callable[[torch.Tensor], None]] = []
        for p in params:
            p._z3_unit = self
        self.release()

    numel = property(lambda self: self.layout.numel)       # real elements
    size = property(lambda self: self.layout.padded_numel)  # elements once gathered

    def shard(self, flat: torch.Tensor) -> torch.Tensor:
        return self.layout.shard(flat, self.rank)

    def _empty(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=self.part.dtype, device=self.device)

    def device_part(self) -> torch.Tensor:
        """This rank's shard on the compute device: ``part``, or a copy in from the host / NVMe (offload_param)."""
        return self.part if self.offload is None else self.offload.fetch(self)

    def gather(self, async_op: bool = False) -> None:
        self.full = self._empty(self.size)
        self.work = comm.all_gather(self.full, self.device_part(), group=self.group, async_op=async_op)
        if not async_op:
            self.wait()

    def wait(self) -> None:
        """Finish an all-gather in flight; the parameters become views into the full buffer."""
        if self.work is not None:
            self.work.wait()
            self.work = None
        for p, view in zip(self.params, self.layout.unflatten(self.full)):
            p.data = view

    def release(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work = None
        self.full = None
        for p in self.params:
            p.data = self._empty(0)

    def take_from(self, rank: int = 0) -> None:
        """Every rank takes group rank ``rank``'s gathered values (a broadcast of the full buffer)."""
        src = rank if self.group is None else dist.get_global_rank(self.group, rank)
        comm.broadcast(self.full, src=src, group=self.group)

    def repartition(self) -> None:
        """Keep this rank's shard of the (edited) full buffer, and hand it to ``on_repartition``."""
        shard = self.shard(self.full)
        for keep in self.on_repartition:  # first: one that refuses leaves the partition as it was
            keep(shard)
        if self.offload is not None:
            self.offload.write_part(self, shard)
        else:
            self.part.copy_(shard)


class GatheredParameters:
    """Full parameters inside the block (DeepSpeed's ``zero.GatheredParameters``); every rank must enter it.

    With ``modifier_rank=r``, rank r's in-place edits (``p.fill_``, ``p.copy_`` under ``torch.no_grad()``)
    are broadcast on exit and re-partitioned on every rank, fp32 master shards included. With None,
    edits are discarded. Units already gathered (persistent ones) stay gathered."""

    def __init__(self, params, modifier_rank: int | None = None, fwd_module=None, enabled: bool = True):
        # DeepSpeed's keywords: enabled=False makes the block a no-op; fwd_module (registering parameters
        # used outside their module's forward) has no counterpart here and is ignored
        params = [] if not enabled else [params] if isinstance(params, torch.Tensor) else list(params)
        self.units = list(dict.fromkeys(p._z3_unit for p in params if hasattr(p, "_z3_unit")))
        self.modifier_rank = modifier_rank

    def __enter__(self):
        self.gathered = [u for u in self.units if u.full is None]
        for u in self.units:
            u.gather() if u.full is None else u.wait()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.modifier_rank is not None and exc_type is None:
            for u in self.units:
                u.take_from(self.modifier_rank)
                u.repartition()
        for u in self.gathered:
            u.release()


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


class Init:
    """Partition every module's parameters over ``group`` as soon as the module is constructed.

    DeepSpeed's keywords are accepted: ``data_parallel_group`` (zero_ref's ``group``), ``enabled=False``
    (a no-op block), ``module=`` (partition a model built already, as if built inside), and
    ``config_dict_or_path`` / ``config`` / ``dtype`` / ``mem_efficient_linear`` / ``pin_memory``, which
    change nothing here: the stage casts the partitions to the config's precision when it adopts them.
    ``remote_device`` (partitions built on the host or NVMe) and DeepSpeed's other options are refused."""

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 *, group=None, **options):
        if group is not None and data_parallel_group is not None:
            raise ValueError("Init: give group= or DeepSpeed's data_parallel_group=, not both")
        if remote_device not in (None, "none") and remote_device != torch.get_default_device().type:
            raise ValueError(f"Init: remote_device={remote_device!r} is not supported by zero_ref (partitions are "
                             "built on the default device); keep them on the host with the config's offload_param")
        unsupported = sorted(k for k, v in {"mpu": mpu, **options}.items() if v not in (None, False))
        if unsupported:
            raise ValueError(f"Init: {', '.join(unsupported)} not supported by zero_ref's Init")
        self.group = group if group is not None else data_parallel_group
        self.enabled = enabled
        if module is not None and enabled:
            for m in module.modules():
                self._partition(m)

    def __enter__(self):
        if not self.enabled:
            return self
        self._building: set[int] = set()  # objects whose outermost __init__ is running
        self._patched: list[tuple[type, object]] = []
        for cls in _subclasses(nn.Module):
            self._wrap(cls)
        self._old_init_subclass = nn.Module.__dict__.get("__init_subclass__")
        wrap = self._wrap

        def init_subclass(cls, **kwargs):  # classes defined inside the block
            super(nn.Module, cls).__init_subclass__(**kwargs)
            wrap(cls)

        nn.Module.__init_subclass__ = classmethod(init_subclass)
        self._old_apply = nn.Module.apply
        nn.Module.apply = _apply_gathered
        return self

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        for cls, init in reversed(self._patched):
            cls.__init__ = init
        if self._old_init_subclass is None:
            del nn.Module.__init_subclass__
        else:
            nn.Module.__init_subclass__ = self._old_init_subclass
        nn.Module.apply = self._old_apply

    def _wrap(self, cls: type) -> None:
        init = cls.__dict__.get("__init__")
        if not inspect.isfunction(init):
            return

        @functools.wraps(init)
        def wrapper(module, *args, **kwargs):
            # super().__init__() chains run several wrapped __init__s on one object: only the
            # outermost partitions, once the subclass has finished (it may still edit the weights).
            outermost = id(module) not in self._building
            self._building.add(id(module))
            try:
                init(module, *args, **kwargs)
            finally:
                if outermost:
                    self._building.discard(id(module))
            if outermost:
                self._partition(module)

        cls.__init__ = wrapper
        self._patched.append((cls, init))

    def _partition(self, module: nn.Module) -> None:
        params = [p for p in module.parameters(recurse=False) if not hasattr(p, "_z3_unit")]  # tied: once
        if params:
            # rank 0's values on every rank before each keeps its shard, as DeepSpeed's Init does
            # (_zero_init_param): a model built with per-rank seeds is still one model
            if dist.get_world_size(self.group) > 1:
                src = dist.get_global_rank(self.group or dist.group.WORLD, 0)
                with torch.no_grad():
                    for p in params:
                        comm.broadcast(p.data, src=src, group=self.group)
            Unit(type(module).__name__, params, self.group)  # kept alive by the parameters (p._z3_unit)


def _apply_gathered(module: nn.Module, fn):
    """``nn.Module.apply`` with each module's own parameters gathered around ``fn(module)``."""
    for child in module.children():
        child.apply(fn)
    units = [u for u in dict.fromkeys(getattr(p, "_z3_unit", None) for p in module.parameters(recurse=False))
             if u is not None and u.full is None]
    for u in units:
        u.gather()
    fn(module)
    for u in units:
        u.take_from(0)  # rank 0's result, as DeepSpeed's apply broadcasts it: an initializer drew per-rank numbers
        u.repartition()
        u.release()
    return module


def register_external_parameter(module: nn.Module, parameter: nn.Parameter) -> None:
    """Tell ZeRO-3 that ``module``'s forward reads ``parameter``, which another module holds (DeepSpeed's
    ``deepspeed.zero.register_external_parameter``): ZeroStage3 gathers its unit in ``module``'s pre-forward
    hook too. ZeroStage3 also finds such reads by itself, on the first forward (see its docstring); registering
    one up front only saves that first, unprefetched gather."""
    if not isinstance(parameter, nn.Parameter):
        raise TypeError(f"register_external_parameter: expected an nn.Parameter, got {type(parameter).__name__}")
    external = module.__dict__.setdefault("_z3_external", [])
    if not any(p is parameter for p in external):
        external.append(parameter)


def unregister_external_parameter(module: nn.Module, parameter: nn.Parameter) -> None:
    """Undo ``register_external_parameter`` (before ZeroStage3 is built; afterwards the stage has read it)."""
    external = module.__dict__.get("_z3_external", [])
    if not any(p is parameter for p in external):
        raise ValueError(f"unregister_external_parameter: that parameter is not registered on {type(module).__name__}")
    external[:] = [p for p in external if p is not parameter]
