"""One rank's real gradients reduced once through a hook, against the exact average."""
import pytest
import torch

import zero_ref
from course.labs.hook_reduction import rank_gradients, reduce_once
from zero_ref import compression
from zero_ref.models import GPT, GPTConfig, make_batch

CFG = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=1)


def test_rank_gradients_are_this_ranks_and_the_average_is_every_ranks():
    mine, average = rank_gradients(CFG, 1, 3)
    grads = []
    for r in range(3):
        torch.manual_seed(0)
        model = GPT(CFG)
        model(*make_batch(CFG, 4, seed=r))[1].backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    assert torch.equal(torch.cat([g.reshape(-1) for g in mine]), grads[1])
    torch.testing.assert_close(average, sum(grads) / 3, rtol=1e-6, atol=0)


def _reduce(rank, world):
    mine, exact = rank_gradients(CFG, rank, world)
    got, log = reduce_once(compression.allreduce_hook, mine, world, rank)
    return got, exact, log.by_op()


@pytest.mark.slow
def test_the_fp32_hook_leaves_the_exact_average_in_one_all_reduce():
    for got, exact, ops in zero_ref.launch(_reduce, 2, timeout=120, echo=False):
        torch.testing.assert_close(got, exact, rtol=1e-6, atol=1e-9)
        assert list(ops) == ["all_reduce"] and ops["all_reduce"]["calls"] == 1
        assert ops["all_reduce"]["bytes"] >= 4 * exact.numel()
