"""The memory model against the ZeRO paper, DeepSpeed's own estimators and Korthikanti et al."""

import pytest
from hypothesis import given, settings, strategies as st

from zero_ref import memory as M


@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_figure_1(stage, expected_gb):
    # Ψ = 7.5B, N_d = 64, K = 12 (fp16 params and grads, fp32 master + Adam states).
    m = M.model_state_bytes(7_500_000_000, zero_stage=stage, dp=64, precision="mixed")
    assert round(m.total / M.GB, 2 if stage == 3 else 1) == expected_gb


def test_zero_paper_formulas_exactly():
    psi, nd, K = 7_500_000_000, 64, 12
    got = [M.model_state_bytes(psi, zero_stage=s, dp=nd).total for s in range(4)]
    assert got == [(4 + K) * psi, 4 * psi + K * psi / nd, 2 * psi + (2 + K) * psi / nd, (4 + K) * psi / nd]


def test_recipes_bytes_per_param():
    assert {n: r.bytes_per_param() for n, r in M.RECIPES.items()} == {
        "fp32": 16, "fp16": 16, "bf16": 16, "bf16_fp32_grads": 18}
    assert M.recipe("mixed").K == 12 and M.recipe("fp32").K == 8
    assert "fp32 master params" in M.recipe_table()


@settings(max_examples=200, deadline=None)
@given(psi=st.integers(1, 10**12), dp=st.integers(1, 4096), precision=st.sampled_from(sorted(M.RECIPES)))
def test_memory_falls_with_stage_and_stage3_divides_everything(psi, dp, precision):
    totals = [M.model_state_bytes(psi, zero_stage=s, dp=dp, precision=precision).total for s in range(4)]
    assert totals == sorted(totals, reverse=True)
    assert totals[3] == pytest.approx(totals[0] / dp, rel=1e-12)


def test_padding_rounds_partitions_up():
    m = M.model_state_bytes(10, zero_stage=3, dp=4, precision="fp32", padded=True)
    assert m.as_dict() == {"params": 12, "grads": 12, "optimizer": 24, "total": 48}  # ceil(10/4)=3 elements


def test_tp_pp_split_before_zero():
    a = M.model_state_bytes(64_000, zero_stage=1, dp=4, tp=8, pp=2)
    b = M.model_state_bytes(4_000, zero_stage=1, dp=4)
    assert a == b


@pytest.mark.parametrize("kwargs,match", [
    (dict(zero_stage=4, dp=1), "zero_stage"),
    (dict(zero_stage=1, dp=0), "dp"),
    (dict(zero_stage=1, dp=2, precision="fp8"), "precision='fp8'"),
    (dict(zero_stage=1, dp=2, tp=1.5), "tp"),
])
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        M.model_state_bytes(1000, **kwargs)


def test_offload_moves_the_right_buffers():
    psi, dp = 1_000_000, 4
    t = M.offload_placement(psi, zero_stage=2, dp=dp, offload_optimizer="cpu")
    assert t["gpu"].as_dict() == {"params": 2 * psi, "grads": 0, "optimizer": 0, "total": 2 * psi}
    assert t["cpu"].total == 16 * psi / dp  # fp32 grads + master + m + v of this rank's partition
    t3 = M.offload_placement(psi, zero_stage=3, dp=dp, offload_optimizer="nvme", offload_param="cpu")
    assert t3["gpu"].total == 0 and t3["cpu"].params == 2 * psi / dp and t3["nvme"].optimizer == 12 * psi / dp
    for kw, match in [(dict(zero_stage=0, offload_optimizer="cpu"), "zero_stage >= 1"),
                      (dict(zero_stage=2, offload_optimizer="nvme"), "zero_stage=3"),
                      (dict(zero_stage=2, offload_param="cpu"), "offload_param"),
                      (dict(zero_stage=3, offload_param="gpu"), "offload_param")]:
        with pytest.raises(ValueError, match=match):
            M.offload_placement(psi, dp=dp, **kw)


def test_transformer_param_count_gpt2_small():
    # GPT-2 small: 12 layers, h=768, V=50257, 1024 positions, tied head: 124,439,808 parameters.
    assert M.transformer_param_count(12, 768, 50257, seq_len=1024) == 124_439_808
    assert M.transformer_param_count(2, 8, 10, bias=False, tied=False) == 2 * 12 * 64 + 2 * 4 * 8 + 20 * 8 + 16


def test_korthikanti_activation_formulas():
    s, b, h, a = 2048, 1, 12288, 96  # GPT-3 175B layer shape from the paper
    sbh = s * b * h
    base = M.activation_bytes_per_layer(s, b, h, a)
    assert base == sbh * (34 + 5 * a * s / h)
    assert M.activation_bytes_per_layer(s, b, h, a, tp=8) == sbh * (10 + 24 / 8 + 5 * a * s / (h * 8))
    assert M.activation_bytes_per_layer(s, b, h, a, tp=8, sp=True) == base / 8
    assert M.activation_bytes_per_layer(s, b, h, a, tp=8, sp=True, recompute="selective") == sbh * 34 / 8
    assert M.activation_bytes_per_layer(s, b, h, a, recompute="full") == 2 * sbh
    assert M.activation_bytes(96, s, b, h, a) == 96 * base
    with pytest.raises(ValueError, match="recompute"):
        M.activation_bytes_per_layer(s, b, h, a, recompute="some")


def test_plan_zero_stage_picks_lowest_fitting():
    stage, rows = M.plan_zero_stage(7_500_000_000, dp=64, device_bytes=32e9)
    assert stage == 1 and [fits for _, _, fits in rows] == [False, True, True, True]
    assert M.plan_zero_stage(7_500_000_000, dp=1, device_bytes=80e9)[0] is None


def test_docstring_examples():
    import doctest
    assert doctest.testmod(M).failed == 0


def test_llama_65b_param_count():
    # LLaMA-65B (80 layers, h 8192, SwiGLU f 22016, RMSNorm, untied head, V 32000): 65.2B parameters.
    n = M.transformer_param_count(80, 8192, 32000, ffn_hidden=22016, bias=False, tied=False, gated=True,
                                  norm="rmsnorm")
    assert n == 80 * (4 * 8192**2 + 3 * 8192 * 22016 + 2 * 8192) + 2 * 32000 * 8192 + 8192
    assert round(n / 1e9, 1) == 65.3
