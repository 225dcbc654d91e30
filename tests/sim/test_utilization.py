"""MFU and HFU: 6ΨT and 8ΨT, against the published Megatron runs' reported utilization."""
import math

import pytest

from sim.calibration.published import A100_PEAK, get
from sim.cost import utilization as u
from sim.cost.flops import model_flops_per_step


def test_flops_and_utilization():
    assert u.model_flops(1e9, 1000) == 6e12
    assert u.hardware_flops(1e9, 1000, "full") == 8e12 and u.hardware_flops(1e9, 1000) == 6e12
    assert math.isclose(u.mfu(2.0, 1e9, 1000, 4, 1e12), 6e12 / 8e12)
    assert math.isclose(u.hfu(2.0, 1e9, 1000, 4, 1e12, "full"), 1.0)


@pytest.mark.parametrize("name", ["korthikanti-22B-seqsel", "korthikanti-175B-seqsel", "korthikanti-1T-seqsel"])
def test_six_psi_t_is_near_the_papers_mfu(name):
    """6ΨT leaves out the attention scores: it undershoots the paper's MFU by about s/6h (+ a little)."""
    run = get(name)
    model = run.model()
    tokens = run.global_batch * model.seq
    ours = u.mfu(run.iteration_time, model.num_params, tokens, run.gpus, A100_PEAK)
    paper = dict(run.reported)["mfu"]
    exact = model_flops_per_step(model, run.global_batch) / (run.iteration_time * run.gpus * A100_PEAK)
    assert abs(exact / paper - 1) < 0.01      # the layer-by-layer count gives the paper's number
    assert -0.06 < ours / paper - 1 < 0.0      # 6ΨT: a few percent low


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="step_time"):
        u.mfu(0, 1e9, 1, 1, 1)
    with pytest.raises(ValueError, match="recompute"):
        u.hardware_flops(1, 1, "selective")
    with pytest.raises(ValueError, match="params"):
        u.model_flops(-1, 1)
