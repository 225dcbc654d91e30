"""Batch-size arithmetic, as DeepSpeed resolves it (pure Python).

    train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps × dp

where dp is the *data-parallel* size (world size / (tensor × pipeline parallel sizes)). Any
one or two of the three keys may be omitted; DeepSpeed fills them in with integer division and
then insists the identity holds, so inconsistent inputs fail rather than round.
"""
from __future__ import annotations

from dataclasses import dataclass

KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclass(frozen=True)
class BatchConfig:
    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    dp: int


def resolve_batch_sizes(train_batch_size=None, train_micro_batch_size_per_gpu=None,
                        gradient_accumulation_steps=None, *, dp: int) -> BatchConfig:
    """Fill in the missing batch keys the way DeepSpeed 0.19 does, then check the identity.

    Raises ValueError naming the keys when a value is not a positive integer, when neither
    ``train_batch_size`` nor ``train_micro_batch_size_per_gpu`` is given, or when
    ``train_batch_size != micro × accumulation × dp``.
    """
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"the data-parallel size must be a positive integer, got {dp!r}")
    tbs, mbs, gas = train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps
    for key, value in zip(KEYS, (tbs, mbs, gas)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{key} must be an integer, got {value!r}")
    if tbs is not None and mbs is not None and gas is None:
        gas = tbs // mbs // dp
    elif tbs is not None and gas is not None and mbs is None:
        mbs = tbs // dp // gas
    elif mbs is not None and gas is not None and tbs is None:
        tbs = mbs * gas * dp
    elif tbs is not None and mbs is None and gas is None:
        gas, mbs = 1, tbs // dp
    elif mbs is not None and tbs is None and gas is None:
        tbs, gas = mbs * dp, 1
    elif tbs is None and mbs is None:
        raise ValueError("set train_batch_size or train_micro_batch_size_per_gpu (or both); "
                         "gradient_accumulation_steps alone cannot determine the batch")
    for key, value in zip(KEYS, (tbs, mbs, gas)):
        if value <= 0:
            raise ValueError(f"{key} resolved to {value}: it must be > 0 (with data-parallel size {dp})")
    if tbs != mbs * gas * dp:
        raise ValueError(f"train_batch_size {tbs} != train_micro_batch_size_per_gpu {mbs} × "
                         f"gradient_accumulation_steps {gas} × data-parallel size {dp} (= {mbs * gas * dp}); "
                         "fix one of the three keys or the number of ranks")
    return BatchConfig(tbs, mbs, gas, dp)
