"""The ZeRO stages as plain building blocks, one short module each (chapters 3–5 read them).

Beside them: ``flat`` (the flat-buffer bookkeeping under every stage: which slice each rank owns) and
``zero_init`` (ZeRO-3's partition: ``Unit``, ``Init``, ``GatheredParameters``; DeepSpeed keeps its
``partition_parameters.py`` beside stage3.py too). ``zero_ref.zero`` is ``zero_init``, as ``deepspeed.zero``.
"""
from zero_ref.stages.base import ZeroOptimizerBase
from zero_ref.stages.ddp import DataParallel
from zero_ref.stages.zero1 import ZeroStage1
from zero_ref.stages.zero2 import ZeroStage2

STAGES = {0: DataParallel, 1: ZeroStage1, 2: ZeroStage2}

__all__ = ["ZeroOptimizerBase", "DataParallel", "ZeroStage1", "ZeroStage2", "STAGES"]
from zero_ref.stages.zero3 import ZeroStage3; STAGES[3] = ZeroStage3; __all__.append("ZeroStage3")  # noqa: E402,E702
