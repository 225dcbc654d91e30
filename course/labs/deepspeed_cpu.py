"""DeepSpeed 0.19.8 itself on CPU ranks, the way chapters run it beside zero_ref.

    deepspeed = import_deepspeed()      # in a rank function: DeepSpeed on its CPU accelerator, gloo only
"""
import os


def import_deepspeed():
    """The ``deepspeed`` module on its CPU accelerator, every collective on gloo.

    DeepSpeed picks its accelerator when it is first imported, so ``DS_ACCELERATOR=cpu`` is set before.
    Its CPU backend would compile a shared-memory all-reduce op in C++ on first use
    (deepspeed/comm/torch.py, ``build_shm_op``, asks ``deepspeed.ops.__compatible_ops__``); marking that op
    incompatible leaves every collective to gloo."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed
