"""Chapter 18's compressed data-parallel training: the hook takes over at ``start``, and the losses are the
rank's own."""
import pytest
import torch

import zero_ref
from course.labs.compressed_training import compressed_losses
from zero_ref import compression
from zero_ref.models import GPT, GPTConfig

CFG = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=1)


def _train(rank, world):
    calls = []

    def hook(bucket, group):
        calls.append(bucket.index)
        compression.allreduce_hook(bucket, group)

    losses = compressed_losses(CFG, hook, rank, world, steps=6, start=2, micro=4)
    return losses, len(calls)


@pytest.mark.slow
def test_the_hook_reduces_from_start_on_and_the_first_loss_is_this_ranks():
    ranks = zero_ref.launch(_train, 2, timeout=120, echo=False)
    torch.manual_seed(0)
    model = GPT(CFG)
    idx, targets = compression.markov_batch(CFG, 8, seed=0)
    for rank, (losses, calls) in enumerate(ranks):
        assert len(losses) == 6 and losses[-1] < losses[0]
        assert losses[0] == pytest.approx(model(idx[4 * rank:4 * rank + 4], targets[4 * rank:4 * rank + 4])[1].item(),
                                          rel=1e-6)
        assert calls > 0 and calls % 4 == 0  # 6 - 2 steps, the same number of buckets in each
