"""ZeRO++ as ``zero.Init`` builds a parameter with it: the settings stay with the parameter.

DeepSpeed 0.19.8's ``Init.__init__`` (runtime/zero/partition_parameters.py) reads ``zero_hpz_partition_size``,
``zero_quantized_weights`` and ``zero_quantized_nontrainable_weights`` from ``config_dict_or_path`` (a keyword
``zero_quantized_weights`` / ``zero_quantized_nontrainable_weights`` set True wins; ``zero_param_parallel_group``
gives the hpZ group itself), and ``initialize`` later converts only the parameters no Init has partitioned
(``DeepSpeedZeRoOffload._convert_to_zero_parameters``, runtime/zero/parameter_offload.py). So, per parameter:

- hpZ: its secondary partition lives in the sub-group of the Init that built it (``ds_zero_param_process_group``,
  ``_partition``), none if that Init had hpZ off, whatever ``initialize``'s config says;
- ``zero_quantized_nontrainable_weights``: a parameter frozen when Init partitions it is stored in int8
  (``_partition_param``), so its gathers are quantized whatever ``initialize``'s config says; one frozen later is
  not (DeepSpeed's ``quantize_nontrainable_params`` re-quantizes it);
- ``zero_quantized_weights`` only loads the quantizer in Init: whether a gather is quantized is ``initialize``'s
  config (``PartitionedParameterCoordinator.__all_gather_params``).

ZeroStage3 reads these records (``built_of``) when it adopts Init's units.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch.distributed as dist

from zero_ref.stages.zero3.secondary_partition import new_subgroups


@dataclass(frozen=True, eq=False)
class BuiltZeroPP:
    """One Init's ZeRO++ settings; ``subgroup`` is this rank's hpZ sub-group (None: hpZ off)."""

    hpz_partition_size: int = 1
    quantized_weights: bool = False
    quantized_nontrainable_weights: bool = False
    subgroup: object = None

    def of(self, p) -> "ParamZeroPP":
        return ParamZeroPP(self, frozen=not p.requires_grad)


@dataclass(frozen=True)
class ParamZeroPP:
    """What a parameter was built with: its Init's settings, and whether it was frozen then."""

    built: BuiltZeroPP
    frozen: bool

    @property
    def quantized_storage(self) -> bool:
        return self.frozen and self.built.quantized_nontrainable_weights


def read_zeropp(config, group, zero_param_parallel_group=None, quantized_weights: bool = False,
                quantized_nontrainable_weights: bool = False) -> BuiltZeroPP:
    """An Init's ZeRO++ settings from its config (dict or JSON path, or None) and keywords; creates the hpZ
    sub-groups (every rank calls this, in the same order)."""
    hpz = 1
    if config is not None:
        from zero_ref.config import ConfigWarning, parse  # the engine warns about the rest of the config
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigWarning)
            z = parse(config, strict=False).zero_optimization
        hpz = z.zero_hpz_partition_size
        quantized_weights = quantized_weights or z.zero_quantized_weights
        quantized_nontrainable_weights = quantized_nontrainable_weights or z.zero_quantized_nontrainable_weights
    if zero_param_parallel_group is None and hpz <= 1:
        return BuiltZeroPP(1, bool(quantized_weights), bool(quantized_nontrainable_weights))
    n = dist.get_world_size(group)
    if zero_param_parallel_group is not None:
        sub, g = zero_param_parallel_group, dist.get_world_size(zero_param_parallel_group)
        if n % g:
            raise ValueError(f"Init: zero_param_parallel_group has {g} ranks, which does not divide the {n} "
                             "data-parallel ranks: give a group of consecutive ranks whose size divides them")
    else:
        g = min(max(hpz, 1), n)  # DeepSpeed: min(size, world size); 0 and 1 are off
        if n % g:
            raise ValueError(f"Init: zero_optimization.zero_hpz_partition_size={hpz} in config_dict_or_path does "
                             f"not divide the {n} data-parallel ranks: use the ranks per node, a divisor of {n}, "
                             "or 1 (off)")
        sub = new_subgroups(group, g) if g > 1 else None
    return BuiltZeroPP(g, bool(quantized_weights), bool(quantized_nontrainable_weights), sub)


def built_of(params) -> ParamZeroPP | None:
    """The record Init left on ``params`` (one unit's), or None if Init did not build them all."""
    records = [getattr(p, "_z3_built_zeropp", None) for p in params]
    if not records or any(r is None for r in records) or len({id(r.built) for r in records}) > 1:
        return None
    return ParamZeroPP(records[0].built, frozen=all(r.frozen for r in records))
