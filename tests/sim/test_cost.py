"""sim.cost and sim.spec.topology: FLOPs, the alpha-beta collective formulas, and which link a group uses."""
import math

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.collectives import all_gather, point_to_point, reduce_scatter, ring_all_reduce, tree_all_reduce
from sim.cost.cost_model import CostModel
from sim.cost.flops import attention_core_flops, layer_forward_flops
from sim.cost.work import Adam, Collective, Compute, Copy
from sim.spec.topology import group_link, group_ranks
from tests.sim.helpers import cluster


def test_layer_flops_are_24bsh2_plus_4bs2h_for_a_gpt_mlp():
    m = sim.Model.preset("gpt3-175b")
    b, s, h = 2, m.seq, m.hidden
    assert layer_forward_flops(m, b) == 24 * b * s * h * h + 4 * b * s * s * h
    assert attention_core_flops(m, b) == 4 * b * s * s * h
    llama = sim.Model.preset("llama-7b")  # SwiGLU: three h×f matrices
    assert layer_forward_flops(llama, 1) == 2 * 2048 * (4 * 4096**2 + 3 * 4096 * 11008) + 4 * 2048**2 * 4096


@settings(max_examples=50, deadline=None)
@given(size=st.floats(1, 1e10), n=st.integers(1, 4096), alpha=st.floats(0, 1e-4), bw=st.floats(1e9, 1e12))
def test_collectives_are_the_alpha_beta_formulas(size, n, alpha, bw):
    if n == 1:
        assert ring_all_reduce(size, n, alpha, bw) == reduce_scatter(size, n, alpha, bw) == 0
        return
    assert ring_all_reduce(size, n, alpha, bw) == 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bw
    assert tree_all_reduce(size, n, alpha, bw) == 2 * math.ceil(math.log2(n)) * alpha + 2 * (n - 1) / n * size / bw
    assert reduce_scatter(size, n, alpha, bw) == all_gather(size, n, alpha, bw) == (n - 1) * alpha + (n - 1) / n * size / bw
    assert point_to_point(size, alpha, bw) == alpha + size / bw
    assert tree_all_reduce(size, n, alpha, bw) <= ring_all_reduce(size, n, alpha, bw)  # same bandwidth term


def test_groups_follow_megatrons_rank_order():
    assert group_ranks("tp", 8, 2, 2) == list(range(8))
    assert group_ranks("dp", 8, 2, 2) == [0, 8]
    assert group_ranks("pp", 8, 2, 2) == [0, 16]
    assert group_ranks("dp", 2, 4, 1, t=1) == [1, 3, 5, 7]


def test_a_group_inside_a_node_uses_nvlink_and_one_spanning_nodes_uses_ib():
    c = cluster(nodes=2)
    tp_inside = group_link(group_ranks("tp", 8, 2, 1), c)
    assert (tp_inside.kind, tp_inside.bandwidth, tp_inside.size) == ("nvlink", c.nvlink_bw, 8)
    dp_across = group_link(group_ranks("dp", 8, 2, 1), c)  # ranks 0 and 8: one GPU per node
    assert (dp_across.kind, dp_across.bandwidth) == ("ib", c.ib_bw / c.gpus_per_node)  # IB per GPU
    wide = group_link(group_ranks("dp", 1, 16, 1), c)  # 8 GPUs per node, each driving its NIC share
    assert (wide.kind, wide.bandwidth) == ("ib", min(c.nvlink_bw, 8 * c.ib_bw_per_gpu))


def test_cost_model_applies_the_formulas_on_the_chosen_link():
    costs = sim.Costs(alpha_ib=7e-6, ib_efficiency=0.9, alpha_nvlink=1e-6, nvlink_efficiency=0.7)
    c, S = cluster(nodes=2), 3e8
    cm = CostModel(c, sim.Plan(tp=8, dp=2), costs)
    b_ib = c.ib_bw_per_gpu * 0.9
    assert cm.duration(Collective("all_reduce", S, "dp")) == min(ring_all_reduce(S, 2, 7e-6, b_ib),
                                                         tree_all_reduce(S, 2, 7e-6, b_ib))
    assert cm.duration(Collective("reduce_scatter", S, "dp", 3)) == 3 * reduce_scatter(S, 2, 7e-6, b_ib)
    b_nv = c.nvlink_bw * 0.7
    assert cm.duration(Collective("all_gather", S, "tp")) == all_gather(S, 8, 1e-6, b_nv)
    assert cm.all_reduce(S, "tp") == (tree_all_reduce(S, 8, 1e-6, b_nv), "tree")
    # a tree that reaches half the ring's bandwidth loses on large messages and wins on small ones
    derated = CostModel(c, sim.Plan(tp=8, dp=2), costs.override(tree_bw_efficiency=0.5))
    assert derated.all_reduce(S, "tp") == (ring_all_reduce(S, 8, 1e-6, b_nv), "ring")
    assert derated.all_reduce(1e3, "tp")[1] == "tree"
    # pipeline stages 16 ranks apart sit on different nodes: p2p over IB
    pp = CostModel(c, sim.Plan(tp=8, pp=2), costs)
    assert pp.duration(Collective("p2p", S, "pp")) == 7e-6 + S / b_ib


def test_compute_pcie_nvme_and_cpu_adam_times():
    c = cluster(nodes=1, pcie_bw=25e9, nvme_read_bw=16e9, nvme_write_bw=8e9)
    costs = sim.Costs(efficiency=0.4, alpha_pcie=0.0, pcie_efficiency=1.0, alpha_nvme=0.0,
                      cpu_adam_rate=4e9, hbm_efficiency=1.0)
    cm = CostModel(c, sim.Plan(dp=8), costs)
    assert cm.duration(Compute(312e12)) == pytest.approx(1 / 0.4)
    assert cm.duration(Copy("h2d", 25e9)) == 1.0 == cm.duration(Copy("d2h", 25e9))
    assert cm.duration(Copy("nvme_read", 2e9)) == 1.0   # a node's NVMe shared by its 8 GPUs
    assert cm.duration(Copy("nvme_write", 1e9)) == 1.0
    assert cm.duration(Adam(5e8, "cpu")) == 1.0    # 4e9 params/s per node, 8 GPUs
    assert cm.adam_bytes == 2 * 12 + 2 + 2                 # bf16: read/write master+moments, grad, param
    assert cm.duration(Adam(1e9)) == pytest.approx(28e9 / c.gpu.hbm_bw)


def test_costs_check_their_fields():
    with pytest.raises(ValueError, match="Costs.efficiency"):
        sim.Costs(efficiency=0)
    with pytest.raises(ValueError, match="Costs.alpha_ib"):
        sim.Costs(alpha_ib=-1.0)
    free = sim.Costs.compute_only()
    cm = CostModel(cluster(nodes=2), sim.Plan(tp=8, dp=2), free)
    assert cm.duration(Collective("all_reduce", 1e9, "dp", 4)) == cm.duration(Copy("h2d", 1e9)) == 0


def test_a_gpu_can_have_its_own_gemm_efficiency():
    """Costs.efficiency_by_gpu: a V100 at its own share of peak, other GPUs at ``efficiency``; bad
    entries are named."""
    costs = sim.Costs(efficiency=0.7, efficiency_by_gpu=(("V100-32GB", 0.4),))
    v100 = CostModel(sim.Cluster.preset("V100-32GB", nodes=1), sim.Plan(dp=8, precision="fp16"), costs)
    a100 = CostModel(cluster(nodes=1), sim.Plan(dp=8), costs)
    assert v100.duration(Compute(125e12)) == pytest.approx(1 / 0.4)
    assert a100.duration(Compute(312e12)) == pytest.approx(1 / 0.7)
    for bad in ((("V100-32GB", 0),), ("V100-32GB", 0.4), ((1, 0.4),)):
        with pytest.raises(ValueError, match="efficiency_by_gpu"):
            sim.Costs(efficiency_by_gpu=bad)
