"""zero_ref.precision: loss scaling identical to DeepSpeed 0.19.8, fp16 config defaults checked
against DeepSpeed's own config code, an overflow check that every rank agrees on, and the
choice of precision from the config."""
import logging
import math
import os
import types

import pytest
import torch
from hypothesis import given, settings, strategies as st

import zero_ref
from zero_ref import comm
from zero_ref.precision import (PRECISIONS, DynamicLossScaler, LossScaleAtMinimum, StaticLossScaler,
                                first_nonfinite, has_overflow, loss_scaler_from_config, precision_from_config)

os.environ.setdefault("DS_ACCELERATOR", "cpu")
ds_loss_scaler = pytest.importorskip("deepspeed.runtime.fp16.loss_scaler")
ds_precision_config = pytest.importorskip("deepspeed.runtime.precision_config")

F, T = False, True


@pytest.fixture(scope="module", autouse=True)
def deepspeed_rank_zero():
    """DeepSpeed's update_scale asks deepspeed.comm for the rank, but only to decide whether to
    log an overflow. deepspeed.comm needs its own backend initialised before it answers. We swap
    in a stand-in that answers rank 0 and quiet the log. The scaling rule itself runs untouched."""
    real_dist, logger = ds_loss_scaler.dist, ds_loss_scaler.logger
    level = logger.level
    ds_loss_scaler.dist = types.SimpleNamespace(get_rank=lambda group=None: 0)
    logger.setLevel(logging.WARNING)
    yield
    ds_loss_scaler.dist = real_dist
    logger.setLevel(level)


def run(scaler, overflows):
    """Feed the overflow pattern; return [(cur_scale, cur_hysteresis)] after each update, and the
    index of the update that raised at the minimum scale (None if none did)."""
    trace = []
    for i, overflow in enumerate(overflows):
        try:
            scaler.update_scale(overflow)
        except Exception as e:
            assert "minimum" in str(e)
            return trace, i
        trace.append((scaler.cur_scale, scaler.cur_hysteresis))
    return trace, None


# ------------------------------------------------------------------ the rule, by hand


def test_golden_table_init_2_16_window_2_hysteresis_2():
    # overflow? scale after  hysteresis after  why
    table = [
        (F, 2**16, 2),  # iter 0: stable = 0-(-1)-1 = 0; no growth yet
        (T, 2**16, 1),  # iter 1: hysteresis 2 absorbs the overflow: 2 -> 1, the scale stays
        (T, 2**15, 1),  # iter 2: hysteresis used up: the scale halves
        (F, 2**15, 1),  # iter 3: stable = 3-2-1 = 0
        (F, 2**15, 1),  # iter 4: stable = 1, not a multiple of the window (2)
        (F, 2**16, 2),  # iter 5: stable = 2: the scale doubles and the hysteresis is refilled
        (T, 2**16, 1),  # iter 6: the refilled hysteresis absorbs this overflow
    ]
    ours = DynamicLossScaler(init_scale=2**16, scale_window=2, delayed_shift=2)
    theirs = ds_loss_scaler.DynamicLossScaler(init_scale=2**16, scale_window=2, min_scale=1, delayed_shift=2,
                                              consecutive_hysteresis=False)
    overflows = [o for o, _, _ in table]
    expected = [(s, h) for _, s, h in table]
    assert run(ours, overflows) == (expected, None)
    assert run(theirs, overflows) == (expected, None)
    assert (ours.cur_iter, ours.last_overflow_iter) == (7, 6)


def test_golden_table_consecutive_hysteresis_refills_on_every_clean_step():
    table = [
        (T, 2**16, 1),  # iter 0: absorbed by hysteresis
        (F, 2**16, 2),  # iter 1: a clean step refills the hysteresis at once
        (T, 2**16, 1),  # iter 2: absorbed again; without consecutive_hysteresis the scale would halve here
        (T, 2**15, 1),  # iter 3: two in a row: the scale halves
    ]
    ours = DynamicLossScaler(init_scale=2**16, scale_window=2, delayed_shift=2, consecutive_hysteresis=True)
    assert run(ours, [o for o, _, _ in table]) == ([(s, h) for _, s, h in table], None)


def test_at_min_scale_raises_our_exception_with_advice():
    s = DynamicLossScaler(init_scale=4, scale_window=1000, min_scale=2)
    s.update_scale(True)  # 4 -> 2, the minimum
    assert s.cur_scale == 2
    with pytest.raises(LossScaleAtMinimum) as err:
        s.update_scale(True)
    assert isinstance(err.value, RuntimeError)
    msg = str(err.value)
    for needed in ("min_loss_scale=2", "bf16", "initial_scale_power", "hysteresis", "iteration 1"):
        assert needed in msg
    assert (s.cur_scale, s.cur_iter) == (2, 1)  # a raising update changes nothing


def test_without_raising_the_scale_sits_at_the_minimum():
    s = DynamicLossScaler(init_scale=2, min_scale=1, raise_error_at_min_scale=False)
    assert run(s, [T, T, T]) == ([(1, 1), (1, 1), (1, 1)], None)


def test_static_scaler_never_changes():
    s = StaticLossScaler(128.0)
    for overflow in (T, F, T):
        s.update_scale(overflow)
    assert s.loss_scale == 128.0 and not s.dynamic
    assert s.scale_loss(torch.tensor(2.0)).item() == 256.0


def test_state_dict_resumes_the_same_sequence():
    pattern = [F, T, F, F, F, T, T, F, F, F, F, F]
    full = DynamicLossScaler(init_scale=2**10, scale_window=2, delayed_shift=2)
    expected, _ = run(full, pattern)
    first = DynamicLossScaler(init_scale=2**10, scale_window=2, delayed_shift=2)
    head, _ = run(first, pattern[:5])
    resumed = DynamicLossScaler()  # different class defaults, all overwritten by the state
    resumed.load_state_dict(first.state_dict())
    tail, _ = run(resumed, pattern[5:])
    assert head + tail == expected
    assert resumed.state_dict() == full.state_dict()


def test_an_injected_inf_skips_exactly_that_step():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = DynamicLossScaler(init_scale=2**8, scale_window=1000, delayed_shift=1)
    applied = []
    for step in range(4):
        opt.zero_grad()
        scaler.scale_loss((w ** 2).sum()).backward()
        if step == 2:
            w.grad[1] = math.inf  # what an fp16 overflow looks like
        before = w.detach().clone()
        overflow = has_overflow([w.grad])  # no process group here: the local check
        if not overflow:
            w.grad.div_(scaler.loss_scale)
            opt.step()
        scaler.update_scale(overflow)
        applied.append(not torch.equal(before, w.detach()))
    assert applied == [True, True, False, True]
    assert scaler.loss_scale == 2**7


# ------------------------------------------------------------------ against DeepSpeed 0.19.8


@settings(max_examples=300, deadline=None)
@given(overflows=st.lists(st.booleans(), max_size=60), window=st.integers(1, 5), hysteresis=st.integers(1, 3),
       consecutive=st.booleans(), min_scale=st.sampled_from([1, 2**10]), init_power=st.integers(4, 16))
def test_same_scale_and_hysteresis_as_deepspeed(overflows, window, hysteresis, consecutive, min_scale, init_power):
    init = 2**init_power
    ours = DynamicLossScaler(init_scale=init, scale_window=window, min_scale=min_scale, delayed_shift=hysteresis,
                             consecutive_hysteresis=consecutive)
    theirs = ds_loss_scaler.DynamicLossScaler(init_scale=init, scale_window=window, min_scale=min_scale,
                                              delayed_shift=hysteresis, consecutive_hysteresis=consecutive)
    assert run(ours, overflows) == run(theirs, overflows)  # every update, and where (if) both raise
    assert (ours.cur_iter, ours.last_overflow_iter) == (theirs.cur_iter, theirs.last_overflow_iter)


def deepspeed_zero_scaler(fp16: dict):
    """Build the scaler exactly as DeepSpeed 0.19.8's ZeRO stages do: DeepSpeedConfig.__init__
    calls get_float16_config(param_dict). The engine passes loss_scale (static_loss_scale),
    loss_scale == 0 (dynamic_loss_scale) and float16_config.dynamic_loss_scale_args() to
    DeepSpeedZeroOptimizer / DeepSpeedZeroOptimizer_Stage3 (runtime/engine.py). Those call
    CreateLossScaler(dtype=torch.half, ...) (stage_1_and_2.py, stage3.py)."""
    cfg = ds_precision_config.get_float16_config({"fp16": fp16})
    return ds_loss_scaler.CreateLossScaler(dtype=torch.half, static_loss_scale=cfg.loss_scale,
                                           dynamic_scaling=cfg.loss_scale == 0,
                                           dynamic_loss_args=cfg.dynamic_loss_scale_args())


FP16_DICTS = [
    {"enabled": True},
    {"enabled": True, "loss_scale": 0},
    {"enabled": True, "hysteresis": 1},
    {"enabled": True, "initial_scale_power": 12},
    {"enabled": True, "loss_scale_window": 200, "min_loss_scale": 4},
    {"enabled": True, "consecutive_hysteresis": True},
    {"enabled": True, "initial_scale_power": 20, "loss_scale_window": 50, "hysteresis": 3, "min_loss_scale": 2,
     "consecutive_hysteresis": True},
    {"enabled": True, "hysteresis": "auto", "initial_scale_power": "auto"},
    {"enabled": True, "loss_scale": 1024},
    {"enabled": True, "loss_scale": 0.5},
]


@pytest.mark.parametrize("fp16", FP16_DICTS, ids=str)
def test_config_builds_the_scaler_deepspeed_builds(fp16):
    ours, theirs = loss_scaler_from_config(fp16), deepspeed_zero_scaler(fp16)
    assert ours.dynamic == theirs.dynamic and ours.loss_scale == theirs.loss_scale
    if ours.dynamic:
        assert (ours.scale_window, ours.min_scale, ours.delayed_shift, ours.cur_hysteresis,
                ours.consecutive_hysteresis, ours.scale_factor) == \
               (theirs.scale_window, theirs.min_scale, theirs.delayed_shift, theirs.cur_hysteresis,
                theirs.consecutive_hysteresis, theirs.scale_factor)


def test_enabled_only_uses_the_documented_defaults_in_deepspeed_0_19():
    # The "fp16 gotcha" (2**32, hysteresis 1 with no scaler keys) is gone in 0.19.8: the scaler
    # arguments always come from DeepSpeedFP16Config.dynamic_loss_scale_args().
    theirs = deepspeed_zero_scaler({"enabled": True})
    assert (theirs.cur_scale, theirs.delayed_shift, theirs.scale_window, theirs.min_scale) == (2**16, 2, 1000, 1)
    ours = loss_scaler_from_config({"enabled": True})
    assert (ours.cur_scale, ours.delayed_shift, ours.scale_window, ours.min_scale) == (2**16, 2, 1000, 1)


def test_the_older_deepspeed_gotcha_on_request():
    # Older DeepSpeed: with none of the scaler keys written, the ZeRO optimizers fell back to
    # DynamicLossScaler's class defaults.
    old = loss_scaler_from_config({"enabled": True, "loss_scale": 0}, deepspeed_gotcha=True)
    assert (old.cur_scale, old.delayed_shift, old.cur_hysteresis, old.scale_window, old.min_scale) == \
           (2**32, 1, 1, 1000, 1)
    # ... while writing any one of them brings in the documented defaults for the rest.
    for key, value in [("initial_scale_power", 16), ("loss_scale_window", 1000), ("min_loss_scale", 1),
                       ("hysteresis", 2), ("consecutive_hysteresis", False)]:
        s = loss_scaler_from_config({"enabled": True, key: value}, deepspeed_gotcha=True)
        assert (s.cur_scale, s.delayed_shift, s.scale_window, s.min_scale) == (2**16, 2, 1000, 1), key
    assert loss_scaler_from_config({"loss_scale": 8}, deepspeed_gotcha=True).loss_scale == 8.0


@pytest.mark.parametrize("fp16, key", [
    ({"loss_scale": -1}, "fp16.loss_scale"),
    ({"loss_scale": float("inf")}, "fp16.loss_scale"),
    ({"loss_scale": True}, "fp16.loss_scale"),
    ({"loss_scale_window": 0}, "fp16.loss_scale_window"),
    ({"min_loss_scale": 0}, "fp16.min_loss_scale"),
    ({"min_loss_scale": 0.5}, "fp16.min_loss_scale"),
    ({"hysteresis": 0}, "fp16.hysteresis"),
    ({"initial_scale_power": "16"}, "fp16.initial_scale_power"),
    ({"consecutive_hysteresis": 1}, "fp16.consecutive_hysteresis"),
    ({"loss_scale_windw": 10}, "loss_scale_windw"),
])
def test_bad_fp16_values_name_the_key(fp16, key):
    with pytest.raises(ValueError, match=key):
        loss_scaler_from_config({"enabled": True, **fp16})


# ------------------------------------------------------------------ precision from the config


def test_precision_from_config():
    assert precision_from_config({}) == "fp32"
    assert precision_from_config({"fp16": {"enabled": True}}) == "fp16"
    assert precision_from_config({"bf16": {"enabled": True}, "fp16": {"enabled": False}}) == "bf16"
    assert precision_from_config({"bfloat16": {"enabled": True}}) == "bf16"
    assert precision_from_config({"fp16": {"loss_scale": 0}}) == "fp32"  # enabled defaults to false
    assert PRECISIONS[precision_from_config({"bf16": {"enabled": True}})] is torch.bfloat16
    assert set(PRECISIONS) == {"fp32", "bf16", "fp16"}


@pytest.mark.parametrize("cfg, match", [
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, r"fp16\.enabled and bf16\.enabled"),
    ({"fp16": {"enabled": True}, "bfloat16": {"enabled": True}}, r"fp16\.enabled and bf16\.enabled"),
    ({"bf16": {"enabled": True}, "bfloat16": {"enabled": False}}, "bfloat16"),
    ({"bf16": {"enabled": "yes"}}, r"bf16\.enabled"),
    ({"fp16": True}, "'fp16'"),
])
def test_precision_from_config_errors(cfg, match):
    with pytest.raises(ValueError, match=match):
        precision_from_config(cfg)


def test_deepspeed_also_refuses_fp16_and_bf16_together():
    from deepspeed.runtime.config import DeepSpeedConfig
    with pytest.raises(AssertionError, match="cannot be simultaneously enabled"):
        DeepSpeedConfig({"train_batch_size": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}},
                        mpu=types.SimpleNamespace(get_data_parallel_world_size=lambda: 1))


# ------------------------------------------------------------------ overflow checks


def test_first_nonfinite_names_the_first_bad_tensor():
    good, inf, nan = torch.ones(3), torch.tensor([1.0, math.inf]), torch.tensor([math.nan])
    assert first_nonfinite({"a": good, "b": None, "c": nan, "d": inf}) == "c"
    assert first_nonfinite([("x", good), ("y", inf.half())]) == "y"
    assert first_nonfinite({"a": good, "i": torch.arange(3)}) is None
    assert not has_overflow([good, None])  # no process group: the local answer
    # isfinite, not the sum: these values are finite although their sum overflows fp32.
    assert not has_overflow([torch.full((4,), 3e38)])


def overflow_on_two_ranks(rank, world_size):
    def check(tensors):
        with comm.recording() as log:
            answer = has_overflow(tensors)
        return answer, [(r.op, r.numel) for r in log.records]

    finite = [torch.ones(5), None, torch.zeros(2, dtype=torch.float16)]
    inf_on_rank1 = [torch.ones(5), torch.tensor([math.inf if rank == 1 else 0.0])]
    nan_on_rank0 = [torch.tensor([math.nan if rank == 0 else 1.0], dtype=torch.bfloat16)]
    return {"inf on rank 1": check(inf_on_rank1), "all finite": check(finite),
            "nan on rank 0": check(nan_on_rank0), "no tensors": check([])}


def test_has_overflow_is_the_same_answer_on_every_rank():
    results = zero_ref.launch(overflow_on_two_ranks, 2, timeout=60)
    one_all_reduce = [("all_reduce", 1)]
    for rank, out in enumerate(results):
        assert out == {"inf on rank 1": (True, one_all_reduce), "all finite": (False, one_all_reduce),
                       "nan on rank 0": (True, one_all_reduce), "no tensors": (False, one_all_reduce)}, rank
