"""course.labs.collective_count: calls and payload bytes of the torch.distributed collectives run in a block."""
import torch
import torch.distributed as td

from course.labs.collective_count import count_collectives
from tests.helpers import free_port


def test_counts_calls_and_payload_bytes_then_puts_torch_back():
    original = td.all_reduce
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        before = torch.ones(3)
        td.all_reduce(before)                                  # outside the block: not counted
        with count_collectives() as log:
            td.all_reduce(torch.ones(10))                      # by position
            td.all_reduce(tensor=torch.ones(4, dtype=torch.bfloat16))   # by keyword, as DeepSpeed calls it
            out = torch.empty(6)
            td.all_gather_into_tensor(out, torch.arange(6.0))  # the payload is the input, not the output
            td.broadcast(torch.zeros(2, dtype=torch.int64), src=0)
        assert dict(log) == {"all_reduce": [2, 10 * 4 + 4 * 2], "all_gather_into_tensor": [1, 6 * 4],
                             "broadcast": [1, 2 * 8]}
        assert torch.equal(out, torch.arange(6.0))             # the collective itself still ran
    finally:
        td.destroy_process_group()
    assert td.all_reduce is original


def test_an_error_in_the_block_puts_torch_back():
    original = td.reduce
    try:
        with count_collectives():
            raise KeyError("stop")
    except KeyError:
        pass
    assert td.reduce is original
