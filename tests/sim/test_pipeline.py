"""Pipeline closed forms hold exactly on the list-scheduled timeline."""

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.flops import attention_core_flops, layer_forward_flops
from sim.step.graph import KINDS
from tests.sim.helpers import cluster


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


# ----------------------------------------------------------------------- zero bubble (ZB-H1)

def idle_per_stage(slots, p):
    makespan = max(s.end for s in slots)
    return makespan, [makespan - sum(s.end - s.start for s in slots if s.stage == st) for st in range(p)]


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 8), extra=st.integers(0, 8), times=st.lists(st.integers(0, 4), min_size=3, max_size=3))
def test_zb_h1_timeline_matches_its_closed_form(p, extra, times):
    """With m ≥ p and t_w ≤ t_f ≤ t_b every stage idles exactly (p − 1)(t_f + t_b − t_w) (Qi et al.), against
    1F1B's (p − 1)(t_f + t_b + t_w) on the same work."""
    t_w, t_f, t_b = sorted(times)
    t_f, t_b = max(t_f, 1), max(t_b, 1)
    m = p + extra
    makespan, idle = idle_per_stage(sim.pipeline_timeline(p, m, "zb-h1", t_f, t_b, t_w=t_w), p)
    assert idle == [(p - 1) * (t_f + t_b - t_w)] * p
    assert makespan == m * (t_f + t_b + t_w) + (p - 1) * (t_f + t_b - t_w)
    assert 1 - (makespan - idle[0]) / makespan == pytest.approx(sim.zb_h1_bubble(p, m, t_f, t_b, t_w))
    one_f_one_b, idle_1f1b = idle_per_stage(sim.pipeline_timeline(p, m, "1f1b", t_f, t_b, t_w=t_w), p)
    assert idle_1f1b == [(p - 1) * (t_f + t_b + t_w)] * p and makespan <= one_f_one_b


def test_zb_h1_closed_form_outside_its_conditions():
    """A W longer than a forward (t_w > t_f) no longer fits the gap it should fill, and with m < p the
    deferred W cannot all be placed in the cool-down: the timeline idles more than the formula says."""
    for p, m, t_f, t_b, t_w in ((2, 4, 1, 3, 2), (4, 2, 1, 1, 1)):
        makespan, idle = idle_per_stage(sim.pipeline_timeline(p, m, "zb-h1", t_f, t_b, t_w=t_w), p)
        assert max(idle) > (p - 1) * (t_f + t_b - t_w)
    assert sim.zb_h1_bubble(4, 8, 1, 1, 1) == pytest.approx(3 / 27)  # idle 3 where 1F1B's is 9 (of 33)
    with pytest.raises(ValueError, match="t_w must be a non-negative number"):
        sim.zb_h1_bubble(4, 8, 1.0, 1.0, -1.0)
    for p, m, t_f, t_b, t_w in ((2, 4, 1, 3, 2), (4, 2, 1, 1, 1), (4, 8, 2, 1, 1)):
        with pytest.raises(ValueError, match="closed form needs m ≥ p and t_w ≤ t_f ≤ t_b"):
            sim.zb_h1_bubble(p, m, t_f, t_b, t_w)


FREE = sim.Costs.compute_only(efficiency=0.5)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 5), extra=st.integers(0, 4), tp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2]),
       zero=st.integers(0, 3), recompute=st.sampled_from(["none", "selective", "full"]),
       granularity=st.sampled_from(["layer", "stage"]), per_stage=st.integers(1, 3))
def test_simulated_zb_h1_step_matches_the_closed_form(p, extra, tp, dp, zero, recompute, granularity, per_stage):
    """sim.simulate with free communication (Costs.compute_only, no head): a layer's W is its weight GEMMs'
    forward FLOPs (the forward less the attention core 4bs²h, which has no weights), its B the rest of the
    backward (recomputation included). Then t_w ≤ t_f ≤ t_b, and the step is ZB-H1's closed form."""
    m = p + extra
    model = sim.Model("tiny", layers=p * per_stage, hidden=256, heads=8, vocab=1000, seq=128)
    plan = sim.Plan(zero_stage=zero, tp=tp, pp=p, dp=dp, num_microbatches=m, schedule="zb-h1", recompute=recompute)
    gpus = cluster("H100-80GB", plan.world_size, gpus_per_node=1)
    r = sim.simulate(model, gpus, plan, FREE, granularity=granularity, head=False)
    rate = gpus.gpu.peak_flops * FREE.efficiency
    fwd, core = layer_forward_flops(model, 1) / tp, attention_core_flops(model, 1) / tp
    full_b = 2 * fwd + {"none": 0, "selective": core, "full": fwd}[recompute]
    t_f, t_w = per_stage * fwd / rate, per_stage * (fwd - core) / rate
    t_b = per_stage * full_b / rate - t_w
    assert r.step_time == pytest.approx(m * (t_f + t_b + t_w) + (p - 1) * (t_f + t_b - t_w), rel=1e-9)
    assert r.bubble_fraction == pytest.approx(sim.zb_h1_bubble(p, m, t_f, t_b, t_w), rel=1e-9, abs=1e-12)
    one_f_one_b = sim.simulate(model, gpus, sim.Plan(**{**plan.__dict__, "schedule": "1f1b"}), FREE,
                               granularity=granularity, head=False)
    assert r.busy["compute"] == pytest.approx(one_f_one_b.busy["compute"], rel=1e-9)  # the same work, reordered
    assert r.step_time <= one_f_one_b.step_time * (1 + 1e-12)


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_zb_h1_reduces_gradients_after_w(zero):
    """The DP buckets fill in W, the pass that produces the weight gradients: every gradient reduce waits on a W."""
    model = sim.Model("tiny", layers=4, hidden=256, heads=8, vocab=1000, seq=128)
    plan = sim.Plan(zero_stage=zero, pp=2, dp=2, num_microbatches=4, schedule="zb-h1")
    g = sim.simulate(model, cluster("H100-80GB", 4, gpus_per_node=1), plan, granularity="layer").graph
    reduces = [i for i in range(len(g)) if KINDS[g.kind[i]] == "grad_reduce"]
    assert reduces and all(KINDS[g.kind[d]] == "weight_grad" for i in reduces for d in g.deps[i])
    weights = [i for i in range(len(g)) if KINDS[g.kind[i]] == "weight_grad"]
    assert len(weights) == 2 * 4 * 2  # a W per layer of each stage (2 layers) per micro-batch, on 2 stages


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (2, 4)])
def test_zb_h1_holds_activations_until_w(p, m):
    """Simulated activation peak per stage: the micro-batches held from F to W, counted along the order (at most
    p, 1F1B's stage-0 peak)."""
    model = sim.Model("tiny", layers=2 * p, hidden=256, heads=8, vocab=1000, seq=128)
    peaks = {}
    for schedule in ("zb-h1", "1f1b"):
        plan = sim.Plan(pp=p, num_microbatches=m, schedule=schedule)
        r = sim.simulate(model, cluster("H100-80GB", p, gpus_per_node=1), plan, FREE, granularity="layer")
        peaks[schedule] = [r.peak_memory[s]["activation"] for s in range(p)]
    per_mb = peaks["1f1b"][-1]  # the last stage holds one micro-batch in 1F1B
    for s in range(p):
        held = peak = 0
        for kind, _, _ in sim.stage_order("zb-h1", p, m, s):
            held += (kind == "F") - (kind == "W")
            peak = max(peak, held)
        assert peaks["zb-h1"][s] == pytest.approx(peak * per_mb) and peak <= min(p, m)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 4), m=st.sampled_from([1, 2, 3, 4, 8]), tp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2]),
       zero=st.integers(0, 1), recompute=st.sampled_from(["none", "selective", "full"]), per_stage=st.integers(1, 2),
       free=st.booleans())
def test_search_bounds_hold_for_zb_h1(p, m, tp, dp, zero, recompute, per_stage, free):
    """The plan search's step-time lower bound stays below the simulated ZB-H1 step (its W passes may trail the
    last B's travel back to stage 0), and a search that opts in ranks ZB-H1 plans."""
    from sim.planning.bounds import time_lower_bound
    model = sim.Model("tiny", layers=p * per_stage, hidden=512, heads=8, vocab=2000, seq=256)
    plan = sim.Plan(zero_stage=zero, tp=tp, pp=p, dp=dp, num_microbatches=m, schedule="zb-h1", recompute=recompute)
    gpus = cluster("H100-80GB", plan.world_size, gpus_per_node=1)
    costs = FREE if free else None
    assert time_lower_bound(model, gpus, plan, costs) <= sim.simulate(model, gpus, plan, costs).step_time * (1 + 1e-9)


def test_search_ranks_zb_h1_when_asked():
    from sim.planning.search import Space, search
    space = Space(tp=(1,), pp=(4,), zero_stages=(1,), micro_batch_sizes=(2,), schedules=("1f1b", "zb-h1"),
                  recompute=("none",), offload=(("none", "none"),))
    rows = search(sim.MODELS["gpt3-1.3b"], cluster("H100-80GB", 8), 64, space, top=5).rows
    assert [r.plan.schedule for r in rows] == ["zb-h1", "1f1b"] and rows[0].step_time < rows[1].step_time
