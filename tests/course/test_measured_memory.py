"""course.labs.measured_memory: the model-state bytes a rank holds at each ZeRO stage are the formula's (up to
padding), and a plan's measured peak holds its model states and more."""
import pytest

import zero_ref
from course.labs.measured_memory import held_bytes, peak_bytes
from zero_ref.memory import model_state_bytes
from zero_ref.models import GPTConfig

CFG = GPTConfig(vocab_size=97, seq_len=16, d_model=32, n_heads=2, n_layers=2, bias=False)


@pytest.mark.slow
def test_held_bytes_are_the_formula_up_to_padding():
    ranks = zero_ref.launch(held_bytes, 2, CFG, timeout=180)
    psi = ranks[0][0]["psi"]
    totals = []
    for stage in range(4):
        want = model_state_bytes(psi, zero_stage=stage, dp=2, precision="bf16").total
        got = [sum(r[stage][c] for c in ("params", "grads", "optimizer")) for r in ranks]
        assert got[0] == got[1] and 0 <= got[0] - want <= 16 * 16
        totals.append(got[0])
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4


@pytest.mark.slow
def test_peak_bytes_hold_the_states_and_more_and_shrink_with_the_stage():
    plans = {"z1": dict(stage=1, micro_batch=2, gas=2), "z2": dict(stage=2, micro_batch=2, gas=2)}
    ranks = zero_ref.launch(peak_bytes, 2, CFG, plans, timeout=180)
    assert ranks[0] == ranks[1]
    (held1, during1), (held2, during2) = ranks[0]["z1"], ranks[0]["z2"]
    assert held2 < held1 and during1 > 0 and during2 > 0
