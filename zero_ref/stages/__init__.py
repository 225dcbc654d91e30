"""The ZeRO stages as plain building blocks, one short module each (chapters 3–5 read them).

Beside them: ``partition`` (``Partition``: what rank r owns of a bucket, the one object every stage builds),
``flat`` (the flat-buffer bookkeeping under every stage: which slice each rank owns) and ``client_optimizer``
(a client's torch optimizer, SGD or any, stepped on the partitions instead of Adam). ZeRO-3 is a
folder, ``zero3/``: its stage and the partitioned parameters (``Unit``, ``Init``, ``GatheredParameters``).
DeepSpeed's ``deepspeed.zero`` is ``zero_ref.ds.zero``, which re-exports them.
"""
from zero_ref.stages.base import ZeroOptimizerBase
from zero_ref.stages.ddp import DataParallel
from zero_ref.stages.partition import Partition
from zero_ref.stages.zero1 import ZeroStage1
from zero_ref.stages.zero2 import ZeroStage2
from zero_ref.stages.zero3 import ZeroStage3

STAGES = {0: DataParallel, 1: ZeroStage1, 2: ZeroStage2, 3: ZeroStage3}

__all__ = ["ZeroOptimizerBase", "DataParallel", "ZeroStage1", "ZeroStage2", "ZeroStage3", "STAGES", "Partition"]
