"""course.labs.context_parallel_runs: ring attention and Ulysses on real ranks equal one device and send what
zero_ref.parallel.context's formulas say; the Ulysses check passes zero_ref's own Ulysses and catches one that
attends only to its own tokens."""
import pytest

import zero_ref
from course.labs.context_parallel_runs import attention_runs, ulysses_run
from zero_ref.parallel.attention import causal_attention
from zero_ref.parallel.context import ring_bytes, ulysses_bytes
from zero_ref.parallel.ulysses import ulysses_attention


def _local_only(q, k, v, group):
    """Wrong: causal attention over this rank's own tokens, no communication."""
    return causal_attention(q, k, v)


@pytest.mark.slow
def test_ring_and_ulysses_equal_one_device_and_send_the_formula_bytes():
    s, b, heads, d = 32, 1, 4, 8
    runs = zero_ref.launch(attention_runs, 4, s, b, heads, d, timeout=120)
    assert runs[0]["one device"] > 0
    for kind, formula in (("ring", ring_bytes), ("ulysses", ulysses_bytes)):
        for cp in (2, 4):
            want = formula(b, s, heads, d, cp, element_size=8)
            for run in runs:
                assert run[kind, cp]["error"] < 1e-12
                assert run[kind, cp]["handed"] == [want["forward"], want["backward"]]


@pytest.mark.slow
def test_the_ulysses_check_tells_a_right_answer_from_a_wrong_one():
    right = zero_ref.launch(ulysses_run, 2, ulysses_attention, timeout=120)
    wrong = zero_ref.launch(ulysses_run, 2, _local_only, timeout=120)
    want = ulysses_bytes(2, 32, 4, 8, 2, element_size=8)
    for r in right:
        assert r["single"] < 1e-12 and r["zero_ref"] == 0 and r["sent"] == [want["forward"], want["backward"]]
        assert r["refused"] == "ValueError naming heads and cp"
    assert all(r["single"] > 1e-3 and r["sent"] == [0, 0] for r in wrong[1:])  # rank 1's queries miss rank 0's keys
    assert all(r["refused"] == "no error" for r in wrong)
