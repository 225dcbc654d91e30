"""sim.cost.work: typed work items check what they hold, deduplicate in a graph, and time as the formulas say."""
import pytest

import sim
from sim.cost.collectives import point_to_point, reduce_scatter
from sim.cost.work import Adam, Collective, Compute, Copy
from sim.step.graph import TaskGraph


def test_work_items_name_what_is_wrong():
    with pytest.raises(ValueError, match="Collective op"):
        Collective("broadcast", 1e6, "dp")
    with pytest.raises(ValueError, match="axis"):
        Collective("all_gather", 1e6, "ep")
    with pytest.raises(ValueError, match="Copy link"):
        Copy("d2d", 1e6)
    with pytest.raises(ValueError, match="Adam runs on"):
        Adam(1e6, "tpu")
    cm = sim.CostModel(sim.Cluster.preset("A100-80GB"), sim.Plan(dp=8))
    with pytest.raises(TypeError, match="not a work item"):
        cm.duration(("compute", 1e12, 0, 1))


def test_equal_items_are_stored_once_and_kinds_never_merge():
    g = TaskGraph(1, 1, 1, 1)
    a = g.add("h2d", "h2d", 0, Copy("h2d", 8.0))
    b = g.add("h2d", "h2d", 0, Copy("h2d", 8), (a,))
    g.add("d2h", "d2h", 0, Copy("d2h", 8.0), (b,))
    g.add("forward", "compute", 0, Compute(8.0), (b,))
    g.finish()
    assert g.works == [Copy("h2d", 8.0), Copy("d2h", 8.0), Compute(8.0)] and g.work == [0, 0, 1, 2]


def test_durations_follow_the_formulas():
    cl, plan = sim.Cluster.preset("A100-80GB", nodes=2), sim.Plan(dp=16)
    c = sim.Costs()
    cm = sim.CostModel(cl, plan, c)
    n, a, bw = cm.link_params("dp")
    assert cm.duration(Collective("reduce_scatter", 1e9, "dp", 3)) == 3 * reduce_scatter(1e9, n, a, bw)
    assert cm.duration(Copy("h2d", 1e9)) == point_to_point(1e9, c.alpha_pcie, cl.pcie_bw * c.pcie_efficiency)
    assert cm.duration(Compute(1e12, 0.0)) == cm.duration(Compute(1e12)) == 1e12 / cm.flops_rate
    assert cm.duration(Adam(1e6, "cpu")) == 1e6 / (c.cpu_adam_rate / cl.gpus_per_node)
