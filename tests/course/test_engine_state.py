"""course.labs.engine_state: in fp32 training the gathered master weights are the parameters, bit for bit, at
every ZeRO stage, and both read the same on every rank."""
import pytest

import zero_ref


def _states(rank, world, stage):
    import torch
    from course.labs.engine_state import full_state, gathered_masters
    from zero_ref import initialize
    from zero_ref.models import GPT, GPTConfig, make_batch

    cfg = GPTConfig(vocab_size=97, seq_len=8, d_model=21, n_heads=3, n_layers=2)
    torch.manual_seed(0)
    config = {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    engine, *_ = initialize(model=GPT(cfg), config=config)
    idx, targets = make_batch(cfg, 4, seed=0)
    engine.backward(engine(idx[2 * rank:2 * rank + 2], targets[2 * rank:2 * rank + 2])[1])
    engine.step()
    return full_state(engine), gathered_masters(engine)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_gathered_masters_are_the_fp32_parameters(stage):
    import torch
    ranks = zero_ref.launch(_states, 2, stage, timeout=180)
    (full, masters), (full1, masters1) = ranks
    assert masters and set(masters) <= set(full)
    assert all(torch.equal(masters[k], full[k]) and torch.equal(masters1[k], masters[k]) for k in masters)
    assert all(torch.equal(full1[k], full[k]) for k in full)
