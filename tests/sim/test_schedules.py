"""sim.step.pipeline's schedule orders: explicit phases, Megatron's interleaved order, topological merging."""
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.step.pipeline import dependency


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
    ["gpipe", "1f1b", "interleaved", "zb-h1"]))
def test_every_op_once_in_a_topological_order(p, k, v, schedule):
    if schedule != "interleaved":
        v = 1
    m = k * p
    order = sim.schedule_order(schedule, p, m, v)
    kinds = "FBW" if schedule == "zb-h1" else "FB"
    assert sorted(order) == sorted((s, kind, i, c) for s in range(p) for kind in kinds
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
    with pytest.raises(ValueError, match="multiple of the number of stages"):
        sim.stage_order("interleaved", 4, 6, 0, virtual=2)
    with pytest.raises(ValueError, match="virtual=2 chunks per stage need"):
        sim.schedule_order("1f1b", 4, 8, 2)
    with pytest.raises(ValueError, match="schedule must be one of"):
        sim.pipeline_timeline(4, 8, "zb-h2")


@pytest.mark.parametrize("schedule,p,m,v", [("1f1b", 4, 8, 1), ("1f1b", 3, 5, 1), ("interleaved", 2, 4, 2),
                                            ("interleaved", 4, 8, 2), ("interleaved", 2, 6, 3)])
def test_orders_equal_torch_pipelinings(schedule, p, m, v):
    """Validation rung 2: the same per-rank action order as torch.distributed.pipelining (2.13).

    torch's stage index for chunk c of rank r is c·p + r, as ours. For plain 1F1B its visualizer
    labels the last rank's forwards one micro-batch too high (it prints '3F8' when p = 4, m = 8),
    so on that rank only the sequence of kinds and the backwards are compared. GPipe differs on purpose: torch runs the
    backwards in micro-batch order, sim.step.pipeline last-in-first-out (as the GPipe paper draws it).
    """
    pytest.importorskip("torch")
    from torch.distributed.pipelining import _schedule_visualizer as vis
    name = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B"}[schedule]
    rows = vis.get_schedule_ops(name, p, m, num_stages_per_rank=v if v > 1 else None)
    for rank, row in enumerate(rows):
        theirs = [(a.computation_type.name, a.microbatch_index, a.stage_index // p)
                  for a in row if a is not None and a.computation_type.name in ("FORWARD", "FULL_BACKWARD")]
        ours = [("FORWARD" if k == "F" else "FULL_BACKWARD", i, c) for k, i, c in sim.stage_order(schedule, p, m, rank, v)]
        if rank < p - 1 or v > 1:
            assert theirs == ours
        else:
            assert [t[0] for t in theirs] == [o[0] for o in ours]
            assert [t for t in theirs if t[0] == "FULL_BACKWARD"] == [o for o in ours if o[0] == "FULL_BACKWARD"]
