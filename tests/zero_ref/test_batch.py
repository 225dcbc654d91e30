"""Batch arithmetic agrees with DeepSpeed's own resolution on every branch."""
import os

import pytest
from hypothesis import given, settings, strategies as st

from zero_ref.config.batch import resolve_batch_sizes

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def deepspeed_resolve(tbs, mbs, gas, dp):
    """DeepSpeed's DeepSpeedConfig batch logic, run on a bare instance (no process group needed)."""
    from deepspeed.runtime.config import DeepSpeedConfig
    cfg = DeepSpeedConfig.__new__(DeepSpeedConfig)
    cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps = tbs, mbs, gas
    cfg.world_size = dp
    cfg._configure_train_batch_size()
    return cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps


maybe = st.one_of(st.none(), st.integers(1, 64))


@settings(max_examples=400, deadline=None)
@given(tbs=st.one_of(st.none(), st.integers(1, 512)), mbs=maybe, gas=maybe, dp=st.integers(1, 16))
def test_same_verdict_as_deepspeed(tbs, mbs, gas, dp):
    try:
        theirs = deepspeed_resolve(tbs, mbs, gas, dp)
    except AssertionError:
        theirs = None
    try:
        r = resolve_batch_sizes(tbs, mbs, gas, dp=dp)
        ours = (r.train_batch_size, r.train_micro_batch_size_per_gpu, r.gradient_accumulation_steps)
    except ValueError:
        ours = None
    assert ours == theirs


def test_messages_name_the_keys():
    with pytest.raises(ValueError, match=r"train_batch_size 10 != train_micro_batch_size_per_gpu 3 × "
                                         r"gradient_accumulation_steps 3 × data-parallel size 1"):
        resolve_batch_sizes(10, 3, dp=1)
    with pytest.raises(ValueError, match="set train_batch_size or train_micro_batch_size_per_gpu"):
        resolve_batch_sizes(gradient_accumulation_steps=4, dp=2)
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu resolved to 0"):
        resolve_batch_sizes(4, gradient_accumulation_steps=8, dp=1)
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an integer"):
        resolve_batch_sizes(8, 2, 2.0, dp=2)
    assert resolve_batch_sizes(2048, 32, dp=4).gradient_accumulation_steps == 16
