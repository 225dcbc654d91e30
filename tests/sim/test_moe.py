"""sim.cost.moe against zero_ref's MoE on real gloo ranks (bytes and parameter counts) and closed forms (time, memory)."""
import math

import pytest

import sim
import zero_ref
from sim.cost.moe import MoE, expert_params, moe_cost
from zero_ref.memory import model_state_bytes

WORLD, EP, EXPERTS, K, CF, MICRO = 4, 2, 4, 2, 1.0, 2
TINY = sim.Model("tiny-moe", layers=2, hidden=16, heads=2, vocab=61, seq=8)   # zero_ref's GPTConfig below


def real_step(rank, world, ep):
    """One forward + backward + gradient reduction of zero_ref's MoE GPT; every recorded call on this rank."""
    import torch
    from zero_ref import comm
    from zero_ref.models import GPTConfig, make_batch
    from zero_ref.parallel import moe
    from zero_ref.parallel.groups import build_groups
    from zero_ref.parallel.topology import Topology

    cfg = GPTConfig(vocab_size=61, seq_len=8, d_model=16, n_heads=2, n_layers=2)
    pg = build_groups(Topology.for_world(world, ep=ep), axes=("dp", "ep", "edp"))
    torch.manual_seed(0)
    model = moe.moe_gpt(cfg, EXPERTS, K, CF, ep_group=pg.ep)
    idx, targets = make_batch(cfg, MICRO, seed=rank)
    with comm.recording() as log:
        _, loss = model(idx, targets)
        loss.backward()
        moe.reduce_gradients(model, pg.edp, pg.dp)
    dense, expert = moe.split_params(model)
    return ([(r.op, r.group_size, r.bytes) for r in log.records],
            sum(p.numel() for p in dense), sum(p.numel() for p in expert))


@pytest.mark.usefixtures("one_thread")
def test_bytes_and_parameters_equal_zero_refs_moe_on_real_ranks():
    plan = sim.Plan(dp=WORLD, micro_batch_size=MICRO, precision="fp32")
    cost = moe_cost(TINY, sim.Cluster(sim.GPUS["A100-80GB"], nodes=1), plan, MoE(EXPERTS, K, CF, ep=EP))
    assert cost.capacity == math.ceil(K * MICRO * TINY.seq * CF / EXPERTS) == 8
    for records, dense, expert in zero_ref.launch(real_step, WORLD, EP, timeout=180, echo=False):
        assert (dense, expert) == (cost.params["dense"], cost.params["expert"])
        # dispatch + combine forward, their transposes backward, in each of the 2 MoE layers
        assert [r for r in records if r[0] == "all_to_all"] == [("all_to_all", EP, cost.dispatch_bytes)] * 8
        # dense gradients over all dp ranks, expert gradients over the edp = dp/ep ranks holding the same experts
        assert [r for r in records if r[0] == "all_reduce"] == [("all_reduce", WORLD, 4 * dense),
                                                                 ("all_reduce", WORLD // EP, 4 * expert)]


def test_all_to_all_time_on_the_link_the_ep_group_crosses():
    costs = sim.Costs()
    model = sim.Model("m", 24, 2048, 16, 50257, 2048)
    moe = MoE(num_experts=64, k=2, capacity_factor=1.25, ep=8, every=2)
    slots = math.ceil(2 * 2048 * 1.25 / 64)
    size = 64 * slots * model.hidden * 2
    for nodes, gpn, kind in ((2, 8, "nvlink"), (8, 2, "ib")):
        cluster = sim.Cluster(sim.GPUS["A100-80GB"], nodes=nodes, gpus_per_node=gpn)
        cost = moe_cost(model, cluster, sim.Plan(dp=16), moe, costs)
        assert cost.capacity == slots and cost.dispatch_bytes == size and cost.link.kind == kind
        nvlink = cluster.nvlink_bw * costs.nvlink_efficiency
        if kind == "nvlink":
            one = 7 * costs.alpha_nvlink + 7 / 8 * size / nvlink
        else:  # 2 ranks per node: 6/8 of the buffer leaves the node, each rank on its own NIC
            one = 7 * costs.alpha_ib + max(6 / 8 * size / (cluster.ib_bw_per_gpu * costs.ib_efficiency), 1 / 8 * size / nvlink)
        assert cost.all_to_all == {"forward": pytest.approx(2 * one, rel=1e-12), "backward": pytest.approx(2 * one, rel=1e-12)}


def test_expert_states_are_partitioned_over_the_expert_data_parallel_group():
    model = sim.Model("m", 24, 2048, 16, 50257, 2048)
    moe = MoE(num_experts=64, k=2, ep=8, every=2)
    cluster = sim.Cluster(sim.GPUS["A100-80GB"], nodes=4)
    per_expert = 2 * 2048 * 8192 + 8192 + 2048
    assert expert_params(model) == per_expert
    for stage in (0, 1, 2, 3):
        cost = moe_cost(model, cluster, sim.Plan(dp=32, zero_stage=stage), moe)
        expert = 12 * 64 // 8 * per_expert                          # 12 MoE layers, 8 experts per rank
        dense = model.num_params + 12 * (2048 * 64 - per_expert)
        assert cost.params == {"dense": dense, "expert": expert}
        want = (model_state_bytes(dense, zero_stage=stage, dp=32, precision="bf16").total
                + model_state_bytes(expert, zero_stage=stage, dp=4, precision="bf16").total)
        assert cost.states_bytes == want


def test_bad_moe_names_the_numbers():
    with pytest.raises(ValueError, match="num_experts = 6 is not divisible by MoE.ep = 4"):
        MoE(num_experts=6, ep=4)
    with pytest.raises(ValueError, match="MoE.ep = 4 must divide Plan.dp = 2"):
        moe_cost(TINY, sim.Cluster(sim.GPUS["A100-80GB"], nodes=1, gpus_per_node=2), sim.Plan(dp=2), MoE(8, ep=4))
    with pytest.raises(ValueError, match="k = 3 must be at most"):
        MoE(num_experts=2, k=3)
