"""The simulator reproduces the pipeline closed forms exactly when communication is free.

With ``Costs.compute_only()`` and no output-head FLOPs, every stage does the same work: t_F and
t_B per micro-batch per stage follow from the FLOPs formulas, and the simulated step must be
(m + p − 1)(t_F + t_B) for GPipe and 1F1B, (v·m + p − 1)(t_F + t_B)/v interleaved — whatever the
tensor/data-parallel degrees, ZeRO stage, recomputation or node granularity.
"""
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.flops import attention_core_flops, layer_forward_flops
from zero_ref.memory import activation_bytes_per_layer
from tests.sim.helpers import cluster

FREE = sim.Costs.compute_only(efficiency=0.5)


def tiny(layers):
    return sim.Model("tiny", layers=layers, hidden=256, heads=8, vocab=1000, seq=128)


def stage_times(model, plan, cluster):
    """t_F and t_B of one micro-batch on one stage (all its chunks) from the FLOPs formulas."""
    rate = cluster.gpu.peak_flops * FREE.efficiency
    lps = model.layers // plan.pp
    fwd = layer_forward_flops(model, plan.micro_batch_size) / plan.tp
    extra = {"none": 0, "full": fwd, "selective": attention_core_flops(model, plan.micro_batch_size) / plan.tp}
    return lps * fwd / rate, lps * (2 * fwd + extra[plan.recompute]) / rate


plans = st.builds(
    dict, p=st.integers(1, 6), m=st.integers(1, 10), tp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2]),
    zero=st.integers(0, 3), recompute=st.sampled_from(["none", "selective", "full"]),
    granularity=st.sampled_from(["layer", "stage", "auto"]), per_stage=st.integers(1, 3))


@settings(max_examples=40, deadline=None)
@given(cfg=plans, schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_gpipe_and_1f1b_step_time_and_bubble(cfg, schedule):
    p, m = cfg["p"], cfg["m"]
    model = tiny(p * cfg["per_stage"])
    plan = sim.Plan(zero_stage=cfg["zero"], tp=cfg["tp"], pp=p, dp=cfg["dp"], num_microbatches=m,
                    schedule=schedule, recompute=cfg["recompute"])
    one_per_node = cluster("H100-80GB", plan.world_size, gpus_per_node=1)
    r = sim.simulate(model, one_per_node, plan, FREE, granularity=cfg["granularity"], head=False)
    t_f, t_b = stage_times(model, plan, one_per_node)
    assert r.step_time == pytest.approx((m + p - 1) * (t_f + t_b), rel=1e-9)
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-9, abs=1e-12)
    assert r.bubble_fraction == pytest.approx(sim.bubble_fraction(p, m), abs=1e-12)
    assert r.busy["compute"] == pytest.approx([m * (t_f + t_b)] * p, rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 5), k=st.integers(1, 3), v=st.integers(1, 3), t=st.integers(1, 2))
def test_interleaved_step_time_and_bubble(p, k, v, t):
    m = k * p
    model = tiny(p * v * t)
    plan = sim.Plan(pp=p, num_microbatches=m, schedule="interleaved", virtual=v)
    one_per_node = cluster("H100-80GB", plan.world_size, gpus_per_node=1)
    r = sim.simulate(model, one_per_node, plan, FREE, head=False)
    t_f, t_b = stage_times(model, plan, one_per_node)
    assert r.step_time == pytest.approx((v * m + p - 1) * (t_f + t_b) / v, rel=1e-9)
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-9, abs=1e-12)
    assert r.bubble_fraction == pytest.approx(sim.bubble_fraction(p, m, v), abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 4), k=st.integers(1, 3), recompute=st.sampled_from(["none", "full"]),
       efficiency=st.sampled_from([0.3, 0.5]))
def test_total_compute_is_the_same_under_every_schedule(p, k, recompute, efficiency):
    """Schedules reorder the work; with real communication costs they must not add or drop any."""
    model, m = tiny(2 * p), k * p
    busy = {}
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        plan = sim.Plan(tp=2, pp=p, dp=2, num_microbatches=m, schedule=schedule, virtual=v,
                        recompute=recompute, zero_stage=1)
        r = sim.simulate(model, cluster("H100-80GB", plan.world_size, gpus_per_node=1), plan, sim.Costs(efficiency=efficiency, efficiency_by_gpu=()))
        busy[schedule] = (r.busy["compute"], r.busy["tp_comm"])
    for schedule in ("1f1b", "interleaved"):
        for got, want in zip(busy[schedule], busy["gpipe"]):
            assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 4), (2, 1), (4, 4)])
def test_1f1b_stage_s_holds_p_minus_s_microbatches_gpipe_holds_m(p, m):
    model = tiny(2 * p)
    for schedule in ("1f1b", "gpipe"):
        plan = sim.Plan(pp=p, num_microbatches=m, schedule=schedule, micro_batch_size=2)
        r = sim.simulate(model, cluster("H100-80GB", plan.world_size, gpus_per_node=1), plan, FREE, granularity="layer")
        per_mb = 2 * activation_bytes_per_layer(model.seq, 2, model.hidden, model.heads)
        for s in range(p):
            held = r.peak_memory[s]["activation"] / per_mb
            assert held == (min(p - s, m) if schedule == "1f1b" else m), (schedule, s)
