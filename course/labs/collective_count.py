"""Count the ``torch.distributed`` collectives a library issues: calls and payload bytes per operation.

    with count_collectives() as log:    # {op: [calls, payload bytes]}
        engine.step()

The wrappers replace the module's functions for the length of the ``with`` block, so a library sees them
where it looks a collective up on ``torch.distributed``. DeepSpeed's backend looks up ``all_reduce``,
``reduce`` and ``broadcast`` at every call, but keeps ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` from when it is made (deepspeed/comm/torch.py, ``TorchBackend.__init__`` →
``get_all_gather_function``): enter the block before ``deepspeed.initialize`` makes it, and keep it open.
"""
from collections import defaultdict
from contextlib import contextmanager

# the argument that holds the payload (the tensor sent), by position and by keyword
PAYLOAD = {"all_reduce": (0, "tensor"), "reduce": (0, "tensor"), "broadcast": (0, "tensor"),
           "all_gather_into_tensor": (1, "input_tensor"), "reduce_scatter_tensor": (1, "input")}


@contextmanager
def count_collectives():
    """Within the block, count each collective of ``PAYLOAD`` that reaches ``torch.distributed``: yields a
    dict {op: [calls, payload bytes]} filled as they run; the original functions are back after it."""
    import torch.distributed as td

    log = defaultdict(lambda: [0, 0])
    originals = {op: getattr(td, op) for op in PAYLOAD}

    def counted(op, original):
        position, keyword = PAYLOAD[op]

        def call(*args, **kwargs):
            t = args[position] if len(args) > position else kwargs[keyword]
            log[op][0] += 1
            log[op][1] += t.numel() * t.element_size()
            return original(*args, **kwargs)
        return call

    for op, original in originals.items():
        setattr(td, op, counted(op, original))
    try:
        yield log
    finally:
        for op, original in originals.items():
            setattr(td, op, original)
