"""Pipeline closed forms hold exactly on the list-scheduled timeline."""

import pytest
from hypothesis import given, settings, strategies as st

import sim


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 16), schedule=st.sampled_from(["gpipe", "1f1b"]),
       t_f=st.sampled_from([1.0, 2.0]), t_b=st.sampled_from([1.0, 2.0, 3.0]))
def test_makespan_and_bubble_match_closed_form(p, m, schedule, t_f, t_b):
    slots = sim.pipeline_timeline(p, m, schedule, t_f=t_f, t_b=t_b)
    makespan = max(s.end for s in slots)
    assert makespan == (m + p - 1) * (t_f + t_b)
    for stage in range(p):
        busy = sum(s.end - s.start for s in slots if s.stage == stage)
        assert busy == m * (t_f + t_b)  # same total work under every schedule
        assert 1 - busy / makespan == pytest.approx(sim.bubble_fraction(p, m))


@pytest.mark.parametrize("p,m", [(4, 8), (8, 4), (2, 1)])
def test_1f1b_holds_at_most_p_microbatches_in_flight(p, m):
    for schedule, bound in (("1f1b", min(p, m)), ("gpipe", m)):
        slots = sim.pipeline_timeline(p, m, schedule)
        first = sorted((s for s in slots if s.stage == 0), key=lambda s: s.start)
        live = peak = 0
        for s in first:  # a micro-batch's activations live from its forward to its backward
            live += 1 if s.kind == "F" else -1
            peak = max(peak, live)
        assert peak == bound


def test_closed_forms():
    assert sim.bubble_fraction(4, 12) == 3 / 15
    assert sim.bubble_overhead(4, 12) == 3 / 12
    assert sim.bubble_fraction(4, 12, virtual=2) == 3 / 27
    with pytest.raises(ValueError, match="microbatches"):
        sim.bubble_fraction(4, 0)
