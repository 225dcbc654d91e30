"""zero_ref.volume: the data-parallel bytes per step of each framework, against the ring formulas."""
import pytest

from zero_ref.comm import ring_wire_bytes
from zero_ref.volume import dp_bytes_per_step

PSI, N = 7_500_000_000, 64


def vol(stage, framework="deepspeed", **kw):
    return dp_bytes_per_step(PSI, zero_stage=stage, dp=N, framework=framework, **kw)


def test_deepspeed_sends_one_and_a_half_times_the_papers_bytes_at_stages_1_and_2():
    ar, rs = ring_wire_bytes("all_reduce", 2 * PSI, N), ring_wire_bytes("reduce_scatter", 2 * PSI, N)
    ag = ring_wire_bytes("all_gather", 2 * PSI, N)
    assert vol(0) == vol(0, "paper") == ar
    assert vol(1) == vol(2) == pytest.approx(ar + ag) == pytest.approx(1.5 * vol(1, "paper"))
    assert vol(1, "paper") == vol(2, "paper") == vol(1, "megatron") == pytest.approx(rs + ag)
    assert vol(3) == vol(3, "paper") == pytest.approx(2 * ag + rs)


def test_gradient_accumulation_repeats_what_each_stage_reduces_every_micro_step():
    f = (N - 1) / N
    assert vol(1, micro_steps=4) == vol(1)
    assert vol(2, micro_steps=4) == pytest.approx(f * PSI * (4 * 2 * 2 + 2))
    assert vol(3, micro_steps=4) == pytest.approx(4 * vol(3))


def test_fsdp2_reshard_reduce_dtype_and_hsdp():
    f = (N - 1) / N
    assert vol(3, "fsdp2", grad_bytes=2) == pytest.approx(vol(3))
    assert vol(3, "fsdp2", grad_bytes=4) == pytest.approx(f * PSI * (2 + 2 + 4))
    assert vol(3, "fsdp2", reshard_after_forward=False) == pytest.approx(f * PSI * (2 + 2))
    # HSDP, 8 shards × 8 replicas: reduce-scatter and gathers over 8, all-reduce of Ψ/8 over 8
    hsdp = vol(3, "fsdp2", dp_shard=8)
    assert hsdp == pytest.approx(7 / 8 * PSI * 6 + 2 * 7 / 8 * PSI / 8 * 2)


@pytest.mark.parametrize("kw, message", [
    (dict(zero_stage=1, dp=4, framework="torch"), "framework"),
    (dict(zero_stage=2, dp=4, framework="megatron"), "zero_stage 1"),
    (dict(zero_stage=5, dp=4), "zero_stage"),
    (dict(zero_stage=1, dp=0), "dp"),
])
def test_bad_input_is_named(kw, message):
    with pytest.raises(ValueError, match=message):
        dp_bytes_per_step(PSI, **kw)
