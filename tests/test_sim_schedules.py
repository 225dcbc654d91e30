"""sim.pipeline's schedule orders: explicit phases, Megatron's interleaved order, topological merging."""
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.pipeline import dependency


def test_interleaved_order_is_megatrons():
    """p = 2, v = 2, m = 4, stage 0: 2(p−1) + (v−1)p = 4 warm-up chunk-forwards, then 1F1B, then drain
    (Megatron's get_model_chunk_id: chunk = (k mod pv) // p, reversed for backwards)."""
    order = sim.stage_order("interleaved", 2, 4, 0, virtual=2)
    assert order == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1),
                     ("F", 2, 0), ("B", 0, 1), ("F", 3, 0), ("B", 1, 1),
                     ("F", 2, 1), ("B", 0, 0), ("F", 3, 1), ("B", 1, 0),
                     ("B", 2, 1), ("B", 3, 1), ("B", 2, 0), ("B", 3, 0)]
    assert sim.warmup_count("interleaved", 2, 4, 1, 2) == 2
    assert sim.warmup_count("1f1b", 4, 8, 1) == 2 and sim.warmup_count("gpipe", 4, 8, 1) == 8


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), k=st.integers(1, 4), v=st.integers(1, 3), schedule=st.sampled_from(
    ["gpipe", "1f1b", "interleaved"]))
def test_every_op_once_in_a_topological_order(p, k, v, schedule):
    if schedule != "interleaved":
        v = 1
    m = k * p
    order = sim.schedule_order(schedule, p, m, v)
    assert sorted(order) == sorted((s, kind, i, c) for s in range(p) for kind in "FB"
                                   for i in range(m) for c in range(v))
    seen = set()
    for s, kind, i, c in order:
        dep = dependency(kind, s, i, c, p, v)
        assert dep is None or dep in seen
        seen.add((kind, s, i, c))
    for s in range(p):  # each stage keeps its own order
        assert [(kind, i, c) for st_, kind, i, c in order if st_ == s] == sim.stage_order(schedule, p, m, s, v)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 6), k=st.integers(1, 4), v=st.integers(1, 4),
       t_f=st.sampled_from([1.0, 2.0]), t_b=st.sampled_from([1.0, 2.0, 3.0]))
def test_interleaved_unit_timeline_matches_the_closed_form(p, k, v, t_f, t_b):
    m = k * p
    slots = sim.pipeline_timeline(p, m, "interleaved", t_f=t_f, t_b=t_b, virtual=v)
    makespan = max(s.end for s in slots)
    assert makespan == (v * m + p - 1) * (t_f + t_b)
    for stage in range(p):
        busy = sum(s.end - s.start for s in slots if s.stage == stage)
        assert 1 - busy / makespan == pytest.approx(sim.bubble_fraction(p, m, v))


def test_bad_schedules_are_named():
    with pytest.raises(ValueError, match="multiple of stages"):
        sim.stage_order("interleaved", 4, 6, 0, virtual=2)
    with pytest.raises(ValueError, match="virtual=2 needs"):
        sim.schedule_order("1f1b", 4, 8, 2)
    with pytest.raises(ValueError, match="schedule must be one of"):
        sim.pipeline_timeline(4, 8, "zb-h1")
