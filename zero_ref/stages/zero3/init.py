"""Building and editing a partitioned model (DeepSpeed's ``zero.Init``, ``zero.GatheredParameters``).

ZeroStage3 (``stage.py``) decides when a ``Unit`` (``unit.py``) is gathered; this module builds units as
a model is constructed and gathers them on request:

    with zero3.Init():
        model = GPT(cfg)        # each module is partitioned as soon as its own __init__ returns
    opt = ZeroStage3(model)     # adopts those partitions as its units (no gather)
    with zero3.GatheredParameters(model.ln_f.parameters(), modifier_rank=0):
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

ZeRO++ (``zero_hpz_partition_size``, ``zero_quantized_weights``, ``zero_quantized_nontrainable_weights``, from
``config_dict_or_path`` or DeepSpeed's keywords) is read here as DeepSpeed 0.19.8's ``Init.__init__``
(runtime/zero/partition_parameters.py) reads it: what a parameter is built with stays with it (``BuiltZeroPP``).

Simplified vs DeepSpeed: no tensor-creation overrides (device/dtype), no meta/``skip_init``
handling, no remote (CPU/NVMe) device.
"""
from __future__ import annotations

import functools
import inspect

import torch
import torch.distributed as dist
import torch.nn as nn

from zero_ref import comm
from zero_ref.stages.zero3.built_zeropp import BuiltZeroPP, read_zeropp
from zero_ref.stages.zero3.unit import Unit, unit_of

__all__ = ["Init", "GatheredParameters", "register_external_parameter", "unregister_external_parameter",
           "registered_external_parameters"]


class GatheredParameters:
    """Full parameters inside the block (DeepSpeed's ``zero.GatheredParameters``); every rank must enter it.

    With ``modifier_rank=r``, rank r's in-place edits (``p.fill_``, ``p.copy_`` under ``torch.no_grad()``)
    are broadcast on exit and re-partitioned on every rank, fp32 master shards included. With None,
    edits are discarded. Units already gathered (persistent ones) stay gathered."""

    def __init__(self, params, modifier_rank: int | None = None, fwd_module=None, enabled: bool = True):
        # DeepSpeed's keywords: enabled=False makes the block a no-op; fwd_module (registering parameters
        # used outside their module's forward) has no counterpart here and is ignored
        params = [] if not enabled else [params] if isinstance(params, torch.Tensor) else list(params)
        self.units = [u for u in dict.fromkeys(map(unit_of, params)) if u is not None]
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
    (a no-op block), ``module=`` (partition a model built already, as if built inside), ZeRO++'s
    ``zero_param_parallel_group`` / ``zero_quantized_weights`` / ``zero_quantized_nontrainable_weights`` and
    ``config_dict_or_path`` / ``config``, whose ``zero_optimization`` ZeRO++ keys are read (``built_zeropp.py``);
    ``dtype`` / ``mem_efficient_linear`` / ``pin_memory`` change nothing here: the stage casts the partitions
    to the config's precision when it adopts them. ``remote_device`` (partitions built on the host or NVMe) and
    DeepSpeed's other options are refused."""

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 zero_param_parallel_group=None, zero_quantized_weights=False,
                 zero_quantized_nontrainable_weights=False, *, group=None, **options):
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
        self.zeropp: BuiltZeroPP | None = None
        if enabled:  # every rank reads the same config, so every rank creates the hpZ sub-groups, in order
            self.zeropp = read_zeropp(config if config is not None else config_dict_or_path, self.group,
                                      zero_param_parallel_group, zero_quantized_weights,
                                      zero_quantized_nontrainable_weights)
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
        params = [p for p in module.parameters(recurse=False) if unit_of(p) is None]  # tied: once
        if params:
            # rank 0's values on every rank before each keeps its shard, as DeepSpeed's Init does
            # (_zero_init_param): a model built with per-rank seeds is still one model
            if dist.get_world_size(self.group) > 1:
                src = dist.get_global_rank(self.group or dist.group.WORLD, 0)
                with torch.no_grad():
                    for p in params:
                        comm.broadcast(p.data, src=src, group=self.group)
            Unit(type(module).__name__, params, self.group)  # kept alive by the parameters (unit_of)
            if self.zeropp is not None:
                for p in params:  # DeepSpeed sets ds_zero_param_process_group and a quantized ds_tensor here
                    p._z3_built_zeropp = self.zeropp.of(p)


def _apply_gathered(module: nn.Module, fn):
    """``nn.Module.apply`` with each module's own parameters gathered around ``fn(module)``."""
    for child in module.children():
        child.apply(fn)
    units = [u for u in dict.fromkeys(map(unit_of, module.parameters(recurse=False)))
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


def registered_external_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters ``register_external_parameter`` declared for ``module``'s forward."""
    return module.__dict__.get("_z3_external", [])
