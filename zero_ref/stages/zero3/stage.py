"""ZeRO-3 (P_os+g+p): partition the parameters too.

No rank holds the whole model. A *unit* (``unit.py``) is one module's own parameters in one padded
``FlatLayout``: rank r keeps shard r, and between uses every ``param.data`` is empty. Model states
per rank: 16Ψ/N bytes in mixed precision, plus the units gathered at the moment.

- Forward: a module's forward pre-hook all-gathers the units it reads, its forward hook releases them.
- Backward re-gathers through ``saved_tensors_hooks``: *pack* swaps a saved tensor that lives in a
  gathered unit for a handle, *unpack* re-gathers the unit and returns the same view of it.
- Gradients as in ZeRO-2 (``GradientShards``): a unit's gradients are staged, then reduce-scattered
  with its ``ReduceGroup`` (``reduce_group.py``) into this rank's gradient shard.
- ``prefetch.py``: the recorded order of uses, which prefetching and ``max_reuse_distance`` follow;
  ``path_check.py``: every rank runs the same collectives; ``init.py``: ``Init``, ``GatheredParameters``;
  ``zeropp.py``: ZeRO++ (quantized gathers, a secondary partition per node, a quantized gradient reduce).

Per step and rank: all-gather Ψ (forward) + Ψ (backward) + reduce-scatter Ψ, 1.5× ZeRO-2's 2Ψ
(with ``max_reuse_distance`` 0).

Simplified vs DeepSpeed: units are whole modules and persistence is per unit (DeepSpeed: per parameter);
a gradient bucket holds whole units; a prefetch is one all-gather per unit (DeepSpeed coalesces them);
``max_live_parameters`` also evicts on demand (DeepSpeed only caps prefetch with it); DeepSpeed checks the
ranks' module order once (``reset_step``), zero_ref every collective (``path_check.py``).
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
import torch.nn as nn

from zero_ref import comm
from zero_ref.optim import AdamConfig
from zero_ref.stages.base import ZeroOptimizerBase
from zero_ref.stages.gradient_shards import GradientShards
from zero_ref.stages.partition import Partition
from zero_ref.stages.zero3.built_zeropp import built_of
from zero_ref.stages.zero3.init import GatheredParameters, registered_external_parameters
from zero_ref.stages.zero3.path_check import BACKWARD, FORWARD, PREFETCH, REDUCE, PathCheck, different_paths, \
    same_collective
from zero_ref.stages.zero3.prefetch import Trace, oldest_idle
from zero_ref.stages.zero3.quantized_reduce import QuantizedShards
from zero_ref.stages.zero3.reduce_group import ReduceGroup, reduce_groups
from zero_ref.stages.zero3.zeropp import ZeroPP
from zero_ref.stages.zero3.unit import Unit, unit_of


class UnitState:
    """ZeroStage3's record of one unit: the ``Unit`` (its shard, gathers and releases), this rank's
    ``Partition`` of it for the optimizer, and when the unit is in use. Trainable units are the stage's
    buckets: ``ZeroOptimizerBase`` counts their gradients in (``ready``, ``launched``) and steps their
    partitions."""

    def __init__(self, unit: Unit, index: int, persistent: bool):
        self.unit, self.index, self.persistent = unit, index, persistent  # position; stays gathered?
        self.hold = 0              # forwards running that use it
        self.pending = 0           # saved-tensor handles not yet unpacked
        self.in_backward = False   # counted as a use of this backward already
        self.age = 0               # when it was last gathered (max_live_parameters evicts the oldest)
        self.partition: Partition | None = None  # trainable units: what this rank's optimizer owns
        self.ready: set[int] = set()  # parameters whose gradient arrived this backward
        self.launched = False          # its gradients are on their way (ZeroOptimizerBase.launch_ready)
        self.flat_grad = None          # (no full gradient buffer: stages 0-1 keep one)
        self.grad_views: list = []     # (nor views into it)
        self.reduce_group: ReduceGroup | None = None  # trainable units: the collective its gradient goes in

    name = property(lambda self: self.unit.name)
    params = property(lambda self: self.unit.params)
    layout = property(lambda self: self.unit.layout)
    numel = property(lambda self: self.unit.numel)  # real elements
    size = property(lambda self: self.unit.size)    # elements once gathered

    @property
    def flat_param(self) -> torch.Tensor:
        """The full buffer when gathered, else a one-element stand-in with its shape, dtype and device (the
        dtype and device are what the step and the offload read)."""
        u = self.unit
        return u.full if u.full is not None else torch.empty(1, dtype=u.part.dtype, device=u.device).expand(u.size)

    def keep_master(self, shard: torch.Tensor) -> None:
        """The unit's edited shard (``GatheredParameters(modifier_rank=...)``) into the fp32 master too."""
        master = self.partition.master
        if master is None:
            raise NotImplementedError(f"editing '{self.name}' with GatheredParameters(modifier_rank=...) while "
                                      "its optimizer states are on NVMe is not supported")
        if master is not self.unit.part:  # (fp32 without offload: the partition is the master)
            master.copy_(shard)


class _Saved(NamedTuple):
    """What pack keeps instead of a tensor that lives in a gathered unit."""

    unit: UnitState
    size: torch.Size
    stride: tuple
    offset: int


class _Parameters(dict):
    """``module._parameters`` under ZeRO-3: reading a released parameter while a forward runs gathers it.

    A forward may read a parameter another module holds without calling that module (``nn.MultiheadAttention``
    reads ``self.out_proj.weight``; a head that multiplies by the embedding's weight). As DeepSpeed's
    ``ZeROOrderedDict`` does (runtime/zero/parameter_offload.py), the read gathers the unit for the innermost
    module running and registers it there, so from then on that module's pre-forward hook gathers it
    (``init.register_external_parameter`` declares one up front)."""

    def __init__(self, stage: "ZeroStage3", params: dict):
        super().__init__(params)
        self._stage = stage

    def __getitem__(self, key):
        p = super().__getitem__(key)
        if p is not None and self._stage._entered:
            self._stage._external(p)
        return p

    def __reduce__(self):  # copied or pickled as the plain dict it stands for, not with the whole stage
        return dict, (dict(self),)


class _Scratch(NamedTuple):
    """What ``UnitGather.gather`` reads of a unit, on scratch buffers (``ZeroStage3._run_like``)."""
    full: torch.Tensor
    part: torch.Tensor
    group: object

    size = property(lambda self: self.full.numel())

    def device_part(self) -> torch.Tensor:
        return self.part


class _Done:
    """A finished collective's handle (ZeRO++'s collectives are synchronous)."""

    def wait(self) -> None:
        pass


class GatherEvent(NamedTuple):
    """One entry of ``ZeroStage3.gather_log``."""
    kind: str        # "gather", "prefetch" or "release"
    unit: str        # the unit's name
    live_numel: int  # gathered elements just after it, persistent units aside


class ZeroStage3(ZeroOptimizerBase):
    """Knobs (DeepSpeed's names). ``prefetch_bucket_size``: after the first micro-step recorded the order
    units are used in, each use starts async all-gathers of the next units in that order, up to this many
    elements. ``param_persistence_threshold``: units of at most this many elements stay gathered (one
    all-gather after each step). ``max_live_parameters``: gathered elements (persistent units aside) stay
    under this; a gather first releases the oldest units not in use. ``max_reuse_distance``: after a use, a
    unit stays gathered if the recorded order uses it again within this many elements; 0 (the default here)
    releases after every use, DeepSpeed's 1e9 (``zero_ref.initialize`` passes it) keeps a model under 1e9
    elements gathered from forward to backward. ``gather_log``: set it to a list to record every gather,
    prefetch and release as a ``GatherEvent``."""

    stage = 3

    def __init__(self, module: nn.Module, *, adam: AdamConfig | None = None, precision: str = "fp32", group=None,
                 reduce_bucket_size: int = int(5e8), overlap_comm: bool = True, gradient_accumulation_steps: int = 1,
                 gradient_clipping: float = 0.0, loss_scaler=None, prefetch_bucket_size: int = int(5e7),
                 param_persistence_threshold: int = int(1e5), max_live_parameters: int = int(1e9),
                 max_reuse_distance: int = 0, offload_optimizer: dict | None = None,
                 offload_param: dict | None = None, aio: dict | None = None,
                 sub_group_size: int = int(1e9), cpu_adam: str = "numba", unit_modules: tuple = (),
                 param_groups: list[dict] | None = None, adam_kernel: str = "torch",
                 optimizer: torch.optim.Optimizer | None = None, zeropp: ZeroPP | None = None):
        # Instances of ``unit_modules`` (e.g. a transformer block class) form one unit with their whole
        # subtree, as FSDP's fully_shard per block does: fewer, larger collectives. Default: one unit per
        # module's own parameters, as DeepSpeed partitions.
        self.unit_modules = tuple(unit_modules)
        self.prefetch_bucket_size, self.max_live = prefetch_bucket_size, max_live_parameters
        self.max_reuse_distance = max_reuse_distance
        self.persistence_threshold = param_persistence_threshold
        self.peak_live_numel = 0  # most gathered elements at once (persistent units aside)
        self.gather_log: list[GatherEvent] | None = None  # set to a list to record every gather and release
        self.trace, self._clock = Trace(), 0  # the order units are used in (prefetch.py)
        self._by_ptr: dict[int, UnitState] = {}  # data_ptr of each gathered buffer -> its unit (for pack)
        self._entered: list[nn.Module] = []
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self.grads = GradientShards(self)  # the gradient path, ZeRO-2's
        self.zeropp = zeropp or ZeroPP()  # ZeRO++ (built with the units)
        self.quantized_reduce = None  # qgZ's reduce (None: reduce-scatter)
        super().__init__(module, adam=adam, precision=precision, group=group, reduce_bucket_size=reduce_bucket_size,
                         overlap_comm=overlap_comm, gradient_accumulation_steps=gradient_accumulation_steps,
                         gradient_clipping=gradient_clipping, loss_scaler=loss_scaler,
                         offload_optimizer=offload_optimizer, offload_param=offload_param, aio=aio,
                         sub_group_size=sub_group_size, cpu_adam=cpu_adam, param_groups=param_groups,
                         adam_kernel=adam_kernel, optimizer=optimizer)
        self.path = PathCheck(self.group, self.world_size, self.units[0].unit.device, self._run_like,
                              same=same_collective, explain=lambda did: different_paths(did, self._unit_names()))

    # ---------------------------------------------------------------- set-up
    def _build(self, module: nn.Module, bucket_size: int) -> list[UnitState]:
        self.quantized_reduce = self.zeropp.build(self.group).reduce  # its sub-groups: every rank creates them
        if self.quantized_reduce is not None:
            self.grads = QuantizedShards(self, self.quantized_reduce)  # qgZ
        self._find_units(module)
        buckets = [u for u in reversed(self.units) if u.params[0].requires_grad]  # ~ the order backward completes them
        if not buckets:
            raise ValueError("the module has no parameters with requires_grad=True")
        masters = {}
        if self.precision != "fp32":
            for u in self.units:
                if u.params[0].requires_grad:
                    masters[u.index] = u.unit.part.clone()  # fp32 master from the values before the cast
                u.unit.part = u.unit.part.to(self.dtype)
            module.to(self.dtype)  # buffers; the parameters are empty here
        self.reduce_groups: list[ReduceGroup] = reduce_groups(buckets, bucket_size, self.world_size)  # launch order
        for g in self.reduce_groups:
            for b in g.units:
                b.reduce_group = g
        for b in buckets:
            self.init_bucket(b, masters)  # the partition (master, Adam moments, gradient shard)
            b.unit.on_repartition.append(b.keep_master)
        if self.param_offload is not None:  # offload_param: partitions live on the host (or NVMe) between uses
            for u in self.units:
                self.param_offload.adopt(u.unit)
        if self.offload is not None:
            self.offload.attach(self, buckets, self.param_offload)  # NVMe: sub-groups and swap files
        self._install_hooks(module, buckets)
        kept = {}  # units zero.Init built with other ZeRO++ settings: they keep them, as in DeepSpeed
        for u in self.units:
            trainable, built = u.params[0].requires_grad, built_of(u.params)
            if built is not None and (why := self.zeropp.differs(built, trainable, self.world_size)):
                kept.setdefault(why, []).append(u.unit.name)
            if not u.persistent:  # persistent units are gathered at full precision once per step, as in DeepSpeed
                u.unit.zeropp = self.zeropp.unit_gather(trainable, built)
        for why, names in kept.items():
            warnings.warn(f"ZeRO++: {len(names)} parameter group(s) ({', '.join(names[:3])}{', ...' * (len(names) > 3)})"
                          f" keep what zero.Init built them with: {why}, as DeepSpeed 0.19.8 does; pass initialize's "
                          "config to zero.Init(config_dict_or_path=...) to apply it", stacklevel=3)
        for u in self.units:
            if u.persistent:
                u.unit.gather()
        return buckets

    def _find_units(self, module: nn.Module) -> None:
        """``self.units`` (one per module's own parameters, trainable and frozen apart; a tied parameter is its
        first holder's), and the units each module's forward gathers (its own, and external ones)."""
        self.units, self._module_units, owner = [], {}, {}
        grouped: set[int] = set()  # modules inside a unit_modules subtree: their parameters are its unit's
        for name, mod in module.named_modules():
            if id(mod) in grouped:
                continue
            group = bool(self.unit_modules) and isinstance(mod, self.unit_modules)
            if group:
                grouped.update(id(m) for m in mod.modules() if m is not mod)
            own = [p for p in mod.parameters(recurse=group) if id(p) not in owner]  # tied: first holder owns
            for trainable in (True, False):
                ps = [p for p in own if p.requires_grad == trainable]
                if ps:
                    label = (name or type(module).__name__) + ("" if len(ps) == len(own) else
                                                               "[trainable]" if trainable else "[frozen]")
                    unit = self._adopt(ps, label)
                    state = UnitState(unit, len(self.units), unit.numel <= self.persistence_threshold)
                    self.units.append(state)
                    owner.update((id(p), state) for p in ps)
            if units := list(dict.fromkeys(owner[id(p)] for p in mod.parameters(recurse=group))):
                self._module_units[mod] = units
        self._unit_of, self._own_units = owner, {m: list(us) for m, us in self._module_units.items()}
        for mod in module.modules():  # registered external parameters (init.register_external_parameter)
            for p in registered_external_parameters(mod):
                if id(p) not in owner:
                    raise ValueError(f"register_external_parameter: a parameter registered on {type(mod).__name__} "
                                     "is not one of the model's")
                if owner[id(p)] not in (units := self._module_units.setdefault(mod, [])):
                    units.append(owner[id(p)])

    def _install_hooks(self, module: nn.Module, buckets: list[UnitState]) -> None:
        """Gradient hooks on the trainable parameters; gather and release hooks on every module."""
        for b in buckets:
            for i, p in enumerate(b.params):
                p.register_hook(self.placeholder(p))
                p.register_post_accumulate_grad_hook(self._make_hook(b, i))
        for mod in self._own_units:
            mod.register_state_dict_pre_hook(self._check_gathered)
        for mod in module.modules():  # every module: one that holds nothing may still read another's parameter
            mod.register_forward_pre_hook(self.pre_forward)
            mod.register_forward_hook(self.post_forward, always_call=True)
            mod._parameters = _Parameters(self, mod._parameters)

    def _adopt(self, params: list[nn.Parameter], name: str) -> Unit:
        """A unit for ``params``: the one ``init.Init`` made if it holds exactly them, else a new one."""
        olds = list(dict.fromkeys(map(unit_of, params)))
        old = olds[0]
        if len(olds) == 1 and old is not None and old.group is self.group and \
                [id(p) for p in old.params] == [id(p) for p in params]:
            old.name = name
            old.on_repartition = []  # (a stage built on it before kept its own master)
            return old
        for old in olds:
            if old is not None:
                old.gather()  # full values back into param.data, then partition them our way
        return Unit(name, params, self.group)

    def master_shard(self, b: UnitState, masters: dict, full: bool) -> torch.Tensor:
        return masters.get(b.index, b.unit.part)  # fp32: the partition is its own master

    def write_param_shard(self, b: UnitState, values: torch.Tensor) -> None:
        if b.unit.offload is not None:  # offload_param: into the host copy or the open NVMe version
            b.unit.offload.write_part(b.unit, values)
        else:
            self.offload.link.to_device(b.unit.part, values)

    # ---------------------------------------------------------------- gather / release
    def live_numel(self) -> int:
        return sum(u.size for u in self.units if u.unit.full is not None and not u.persistent)

    def fetch(self, u: UnitState, op: int) -> None:
        if u.unit.full is None:
            if op != PREFETCH:
                while self.live_numel() + u.size > self.max_live:  # release the oldest units not in use
                    oldest = oldest_idle(self.units)
                    if oldest is None:
                        break
                    self.release(oldest)
            self.path.announce((u.index, op))
            u.unit.gather(async_op=op == PREFETCH)
            self._clock += 1
            u.age = self._clock
            self._by_ptr[u.unit.full.untyped_storage().data_ptr()] = u
            self.peak_live_numel = max(self.peak_live_numel, self.live_numel())
            self._log("prefetch" if op == PREFETCH else "gather", u)
        elif u.unit.work is not None and op != PREFETCH:
            u.unit.wait()

    def release(self, u: UnitState) -> None:
        if u.unit.full is not None and not u.persistent:
            self._by_ptr.pop(u.unit.full.untyped_storage().data_ptr(), None)
            u.unit.release()
            self._log("release", u)

    def _log(self, kind: str, u: UnitState) -> None:
        if self.gather_log is not None:
            self.gather_log.append(GatherEvent(kind, u.name, self.live_numel()))

    def _unit_names(self) -> list[str]:
        return [u.name for u in self.units]

    def _run_like(self, key: tuple[int, int]):
        """The collective ``key`` names (what the other ranks run now), on scratch buffers."""
        state, op = self.units[key[0]], key[1]
        u = state.unit
        if op == REDUCE:
            n = state.reduce_group.shard_numel
            full, shard = u.empty(n * self.world_size).zero_(), u.empty(n).zero_()  # zeros, not stale memory
            if self.quantized_reduce is not None:
                self.quantized_reduce(shard, full, group=self.group)
                return _Done()
            return comm.reduce_scatter(shard, full, group=self.group, async_op=True)
        full, shard = u.empty(u.size).zero_(), u.empty(u.layout.shard_numel).zero_()
        if u.zeropp is not None:  # ZeRO++'s collectives for this unit, on scratch
            scratch = _Scratch(full, shard, u.group)
            u.zeropp.gather(scratch)
            # hpZ: the ranks on the path keep a secondary copy now and gather the next time in the sub-group; so
            # does this rank (scratch values: end_backward drops every copy once the paths are found to differ)
            u.zeropp.keep_secondary(scratch)
            return _Done()
        return comm.all_gather(full, shard, group=self.group, async_op=True)

    # ---------------------------------------------------------------- trace and prefetch
    def on_use(self, u: UnitState) -> None:
        """A use of ``u``: record it (first micro-step) or follow the trace and prefetch what comes next."""
        budget = self.prefetch_bucket_size
        for v in self.trace.use(u):
            if budget <= 0 or (v.unit.full is None and self.live_numel() + v.size > self.max_live):
                break
            if v.unit.full is None:
                self.fetch(v, PREFETCH)
                budget -= v.size

    def reused_soon(self, u: UnitState) -> bool:
        """Keep ``u`` gathered after this use? Yes if the recorded order uses it again within ``max_reuse_distance``."""
        return self.trace.reused_within(u, self.max_reuse_distance)

    # ---------------------------------------------------------------- forward
    def pre_forward(self, mod: nn.Module, args) -> None:
        for u in self._module_units.get(mod, ()):
            self._hold(u)
        self._saved_hooks.__enter__()
        self._entered.append(mod)

    def _hold(self, u: UnitState) -> None:
        self.fetch(u, FORWARD)
        u.hold += 1
        self.on_use(u)

    def post_forward(self, mod: nn.Module, args, output) -> None:
        if self._entered and self._entered[-1] is mod:  # (not when the pre-hook raised)
            self._entered.pop()
            self._saved_hooks.__exit__(None, None, None)
            for u in self._module_units.get(mod, ()):
                u.hold -= 1
                if u.hold == 0 and not self.reused_soon(u):
                    self.release(u)

    def _external(self, p: nn.Parameter) -> None:
        """A forward read ``p`` (``module.weight``): if its unit is not gathered, the innermost running module
        reads another module's parameter; gather the unit for it, now and in its pre-forward from now on."""
        u = self._unit_of.get(id(p))
        if u is None or (u.unit.full is not None and u.unit.work is None):
            return  # not ours, or gathered (by its holder, which is running)
        units = self._module_units.setdefault(self._entered[-1], [])
        if u not in units:
            units.append(u)
            self._hold(u)
        else:  # prefetched for this module and not yet waited on
            self.fetch(u, FORWARD)

    # ---------------------------------------------------------------- backward
    def pack(self, t: torch.Tensor):
        """A tensor autograd saves: one that lives in a gathered unit (a parameter, or a view such as a linear
        layer's ``weight.t()``) becomes a handle that ``unpack`` re-gathers. So backward gathers what autograd
        reads, when it reads it, and no saved view pins a full weight from forward to backward (DeepSpeed
        swaps in its own linear layer for that)."""
        ptr = t.untyped_storage().data_ptr()
        u = self._by_ptr.get(ptr)
        if u is None or u.unit.full is None or u.unit.full.untyped_storage().data_ptr() != ptr:
            return t  # an activation, or a persistent parameter (always there)
        u.pending += 1
        return _Saved(u, t.size(), t.stride(), t.storage_offset())

    def unpack(self, saved):
        if not isinstance(saved, _Saved):
            return saved
        u = saved.unit
        self.fetch(u, BACKWARD)
        if not u.in_backward:
            u.in_backward = True
            self.on_use(u)
        t = u.unit.full.as_strided(saved.size, saved.stride, saved.offset)
        u.pending -= 1
        if u.pending <= 0 and u.hold == 0:
            u.in_backward = False
            if not self.reused_soon(u):
                self.release(u)  # autograd holds `t` (and so the memory) until this node is done
        return t

    def placeholder(self, p: nn.Parameter):
        """AccumulateGrad checks a gradient against the parameter's shape: a released parameter gets a
        one-element placeholder of its full shape while its gradient accumulates."""
        def hook(grad: torch.Tensor) -> None:
            if p.data.shape != grad.shape:  # released; AccumulateGrad needs the shape, never the values
                p.data = grad.new_empty(1).expand(grad.shape)
        return hook

    def reduces_this_micro_step(self) -> bool:
        return True  # every micro-step: there is no full buffer to accumulate into

    def init_bucket(self, b: UnitState, masters: dict) -> None:
        b.partition = self.new_partition(b, self.master_shard(b, masters, full=False), grad=True)

    def on_grad_ready(self, b: UnitState, i: int, param: torch.Tensor) -> None:
        self.grads.stage(b, i, param)  # into the unit's staging buffer; param.grad is freed
        if b.unit.full is None or b.unit.work is not None:
            param.data = b.unit.empty(0)  # drop the placeholder

    def reduce_bucket(self, b: UnitState) -> None:
        """Into its group's buffer; the group's reduce-scatter once its last unit is in."""
        g = b.reduce_group
        flat = g.put(b, self.grads.take(b, b.unit.part.dtype, b.unit.device))
        if flat is None:
            return
        self.path.announce((g.units[0].index, REDUCE))
        self.grads.reduce(flat, into=[(u.partition, offset) for u, offset in g.offsets.items()])

    def grad_shards(self) -> list[torch.Tensor]:
        return self.grads.averaged([b.partition for b in self.buckets])

    def clear_grads(self) -> None:
        self.grads.clear([b.partition for b in self.buckets])

    def end_backward(self, failed: bool = False) -> None:
        steady = self.trace.steady  # following a recorded order: it repeats
        try:
            super().end_backward(failed)
        except BaseException:
            self.path.drop()
            self._drop_secondaries()
            raise
        if failed:
            self.path.drop()
            self._drop_secondaries()
        else:
            self.path.end(keep=steady)

    def _drop_secondaries(self) -> None:
        """hpZ: a failed backward (on every rank alike) leaves no secondary copy; the next gathers are primary."""
        for u in self.units:
            if u.unit.zeropp is not None:
                u.unit.zeropp.invalidate()

    def after_backward(self) -> None:
        for g in self.reduce_groups:  # (a failed backward leaves a group half filled)
            g.reset()
        for u in self.units:  # gathered but never unpacked (unused branch, unused prefetch)
            u.pending, u.in_backward = 0, False
            if u.hold == 0:
                self.release(u)
        self.trace.end_micro_step()

    # ---------------------------------------------------------------- step and state
    def state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """What this rank holds at rest: parameter partitions (and persistent full copies),
        gradient partitions, optimizer states (+ fp32 masters under mixed precision)."""
        out = {"params": [], "grads": [], "optimizer": []}
        for u in self.units:
            out["params"] += [u.unit.part] + ([u.unit.full] if u.unit.full is not None else [])
            if u.unit.zeropp is not None and u.unit.zeropp.secondary is not None:
                out["params"].append(u.unit.zeropp.secondary)  # hpZ's secondary slice
        for b in self.buckets:
            out["grads"].append(b.partition.grad)
            out["optimizer"] += [t for t in b.partition.optimizer_tensors() if t is not b.unit.part]
        if self.client is not None:
            out["optimizer"] += self.client.state_tensors()
        return out

    def publish_params(self) -> None:
        for b in self.buckets:
            if b.unit.zeropp is not None:
                b.unit.zeropp.invalidate()  # hpZ: the next gather (forward) comes from the updated primary
            if self.offload is None and b.partition.master is not b.unit.part:
                b.unit.part.copy_(b.partition.master)  # mixed precision: cast the fp32 master down
            if b.persistent:
                self._async(comm.all_gather(b.unit.full, b.unit.device_part(), group=self.group, async_op=self.overlap_comm))
        self._wait_all()

    def _check_gathered(self, mod: nn.Module, prefix: str, keep_vars: bool) -> None:
        for u in self._own_units[mod]:
            if u.unit.full is None or u.unit.work is not None:
                raise RuntimeError(
                    f"state_dict() at '{prefix or u.name}': ZeRO-3 has partitioned '{u.name}' (this rank holds "
                    f"1/{self.world_size} of it; param.data is empty), so module.state_dict() would silently "
                    "return empty tensors. Call ZeroStage3.state_dict() on every rank (it gathers full tensors), "
                    "or wrap the call in `with GatheredParameters(model.parameters()):`.")

    def state_dict(self) -> dict:
        """The module's state dict with full tensors. A collective: call it on every rank."""
        with GatheredParameters(self.module.parameters()):
            return {k: v.detach().clone() for k, v in self.module.state_dict().items()}
