"""sim.views.widgets: the explorers update in place when a control moves, and show what the library computes."""

import numpy as np
import pytest
from matplotlib.collections import PolyCollection

import sim
from sim.step.graph import STREAMS
from sim.views import widgets

SMALL = dict(model="gpt3-1.3b", tp=2, pp=4, dp=2, microbatches=8, zero_stage=1, recompute="none")


def bars(ax):
    return sum(len(c.get_paths()) for c in ax.collections if isinstance(c, PolyCollection))


def test_library_functions_are_what_the_explorer_shows():
    r = widgets.explorer_result(**SMALL)
    model, cluster, plan = widgets.explorer_inputs(**SMALL)
    assert (cluster.world_size, plan.num_microbatches, model.name) == (16, 8, "gpt3-1.3b")
    same = sim.simulate(model, cluster, plan, granularity=widgets.granularity_for(model, plan))
    assert r.step_time == same.step_time
    text = widgets.summary_text(r)
    assert f"step {r.step_time:.3f} s" in text and f"MFU {r.mfu:.1%}" in text and "fits" in text
    assert f"bubble {r.bubble_fraction:.1%}" in text and f"{sim.bubble_fraction(4, 8):.1%}" in text
    for label in ("fill/drain", "p2p wait", "exposed comm", "offload stall"):
        assert label in text
    assert len(r.graph) <= widgets.NODE_BUDGET or widgets.granularity_for(model, plan) == "stage"


def test_explorer_redraws_the_same_figure_when_a_control_moves():
    ex = widgets.explore(**SMALL)
    fig, image, gantt, mem = ex.figure, ex.image, ex.axes[0], ex.axes[1]
    text0, png0, bars0 = ex.summary.value, image.value, bars(gantt)
    assert png0[:4] == b"\x89PNG" and "TP 2 × PP 4 × DP 2" in text0
    assert bars0 == len(ex.result.graph) - sum(  # every event of the shown rows is one bar
        1 for s in ex.result.graph.stream if STREAMS[s] not in {"compute", "tp_comm", "dp_comm", "pp_comm"})

    ex.controls["microbatches"].value = 16
    assert ex.result.plan.num_microbatches == 16 and "m=16" in ex.summary.value
    assert ex.summary.value != text0 and image.value != png0
    assert bars(gantt) > bars0
    assert ex.figure is fig and ex.image is image and ex.axes == [gantt, mem]  # in place
    n_coll = len(gantt.collections), len(mem.collections)

    ex.controls["zero_stage"].value = 3
    assert "ZeRO-3" in ex.summary.value and ex.result.plan.zero_stage == 3
    assert ex.result.peak_memory[0]["zero3_gathered"] > 0
    ex.controls["zero_stage"].value = 1
    assert (len(gantt.collections), len(mem.collections)) == n_coll  # replaced, not piled up

    ex.controls["offload"].value = "optimizer → CPU"
    assert ex.result.plan.offload_optimizer == "cpu" and ex.result.idle["offload_stall"].any()
    assert widgets.summary_text(ex.result) in ex.summary.value.replace("&gt;", ">")


def test_an_invalid_setting_is_reported_not_raised():
    ex = widgets.explore(**SMALL)
    good = ex.result
    ex.controls["schedule"].value = "interleaved"
    ex.controls["microbatches"].value = 6  # not a multiple of pp = 4
    assert ex.error and "multiple of Plan.pp" in ex.error and "multiple of Plan.pp" in ex.summary.value
    ex.controls["microbatches"].value = 8
    assert ex.error is None and ex.result.plan.schedule == "interleaved" and ex.result is not good
    with pytest.raises(ValueError, match="unknown explorer setting"):
        widgets.explore(stages=3)


def test_pipeline_explorer_shows_the_closed_form_bubble():
    pe = widgets.pipeline_explorer(stages=4, microbatches=8, schedule="1f1b")
    assert "bubble 0.2727 simulated = 0.2727 closed form" in pe.summary.value
    png = pe.image.value
    pe.controls["schedule"].value = "interleaved"  # v = 2 by default
    assert pe.result.plan.virtual == 2 and f"{sim.bubble_fraction(4, 8, 2):.4f} closed form" in pe.summary.value
    assert pe.image.value != png
    assert pe.result.bubble_fraction == pytest.approx(sim.bubble_fraction(4, 8, 2), abs=1e-12)
    pe.controls["stages"].value = 3  # 8 micro-batches do not split over 3 interleaved stages
    assert pe.error and "multiple" in pe.error
    pe.controls["schedule"].value = "gpipe"
    assert pe.error is None and pe.result.plan.pp == 3
    assert np.allclose(pe.result.idle["fill_drain"], sim.bubble_fraction(3, 8) * pe.result.step_time, rtol=1e-12)
