"""Chapter 30's trial (course/labs/ch30.py): a plan's layout scaled down, run on ranks, set beside the simulator."""
import pytest

import sim
import zero_ref
from course.labs import ch30 as lab
from sim.calibration import calibrate


def test_every_axis_the_plan_splits_is_kept_and_zero_2_3_run_as_zero_1_with_the_reason():
    layout = lab.scaled_layout(sim.Plan(tp=4, pp=8, dp=2, zero_stage=1))
    assert (layout.tp, layout.pp, layout.dp, layout.zero_stage, layout.world) == (2, 2, 2, 1, 8)
    pure = lab.scaled_layout(sim.Plan(dp=16, zero_stage=0))
    assert (pure.tp, pure.pp, pure.dp, pure.zero_stage) == (1, 1, 2, 0)
    for stage in (2, 3):
        layout = lab.scaled_layout(sim.Plan(tp=2, dp=8, zero_stage=stage))
        assert (layout.tp, layout.pp, layout.dp, layout.zero_stage) == (2, 1, 2, 1)
        assert f"in place of the plan's ZeRO-{stage}" in layout.note and "ThreeD runs ZeRO-0/1" in layout.note


@pytest.mark.slow
def test_a_data_parallel_trial_sends_and_holds_what_the_simulator_books():
    """tp = pp = 1, dp = 2, ZeRO-1: every rank holds 4Ψ of parameters, 4Ψ of gradients and 4Ψ of Adam's
    moments (8Ψ over 2), as the simulator does; it sends (n−1)/n · 4Ψ twice (reduce-scatter, all-gather)
    plus the gradient norm's two float64 all-reduced (16 bytes), which the simulator leaves out. Where a
    stage splits the model (tp, pp) the two part, and the chapter shows by how much."""
    layout = lab.Layout(1, 1, 2, 1, "")
    booked = lab.simulated(layout, calibrate.calibrate())[0]
    psi = lab.CFG.num_params()
    assert booked["memory"] == {"params": 4 * psi, "grads": 4 * psi, "optimizer": 4 * psi}
    for rank in zero_ref.launch(lab.trial, 2, 1, 1, 1, timeout=300):
        assert rank["memory"] == booked["memory"]
        assert rank["sends"] == {"tp": 0.0, "pp": 0.0, "dp": booked["sends"]["dp"] + 16}
