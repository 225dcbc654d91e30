"""ZeRO-3: partitioned parameters, one idea per file.

``unit.py`` (``Unit``: a shard, gathered and released), ``init.py`` (``Init``, ``GatheredParameters``:
building and editing a partitioned model, DeepSpeed's ``deepspeed.zero``), ``prefetch.py`` (the recorded
order of uses), ``reduce_group.py`` (gradients of several units in one reduce-scatter), ``path_check.py``
(every rank runs the same collectives) and ``stage.py`` (``ZeroStage3``, which composes them).
ZeRO++ (``zeropp.py``, ``ZeroPP``): ``block_quant.py`` (int8/int4 blocks), ``quantized_gather.py`` (qwZ),
``secondary_partition.py`` (hpZ), ``quantized_reduce.py`` (qgZ).
"""
from zero_ref.stages.zero3.init import (GatheredParameters, Init, register_external_parameter,
                                        registered_external_parameters, unregister_external_parameter)
from zero_ref.stages.zero3.reduce_group import ReduceGroup
from zero_ref.stages.zero3.stage import GatherEvent, UnitState, ZeroStage3
from zero_ref.stages.zero3.unit import Unit, unit_of
from zero_ref.stages.zero3.zeropp import ZeroPP

__all__ = ["ZeroStage3", "ZeroPP", "Unit", "unit_of", "Init", "GatheredParameters", "ReduceGroup", "UnitState",
           "GatherEvent",
           "register_external_parameter", "unregister_external_parameter", "registered_external_parameters"]
