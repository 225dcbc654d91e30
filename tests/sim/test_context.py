"""sim.cost.context against closed forms: bytes, links, activation memory, and when the ring hides its traffic.

Exact (==) where the quantity is a count of bytes; 1e-12 relative where it is seconds (one float
division apart from the closed form).
"""
import math

import pytest

import sim
from sim.cost.context import context_cost, cp_ranks
from zero_ref.memory import activation_bytes_per_layer
from tests.sim.helpers import cluster

LLAMA = sim.Model("llama-7b-like", layers=32, hidden=4096, heads=32, vocab=32000, seq=32768, gated=True)
NO_ALPHA = sim.Costs(alpha_nvlink=0.0, alpha_ib=0.0)


def test_bytes_per_layer_are_the_ring_and_all_to_all_counts():
    # b = 1, s = 32768, h = 4096, cp = 4, bf16: one rank's K/V block is 2·(s/cp)·h·2 bytes
    block = 2 * (32768 // 4) * 4096 * 2
    ring = context_cost(LLAMA, cluster("H100-80GB", nodes=2), sim.Plan(cp=4, dp=4))
    assert block == 134_217_728
    assert ring.bytes == {"forward": 3 * block, "backward": 7 * block}
    # Ulysses: Q, K, V and the output, each (s/cp)·h·2 bytes, every pass: 4·(s/cp)·h·2, the size of two blocks
    uly = context_cost(LLAMA, cluster("H100-80GB", nodes=2), sim.Plan(cp=4, dp=4, cp_kind="ulysses"))
    assert uly.bytes == {"forward": 2 * block, "backward": 2 * block}
    # at cp = 8 the ring's bytes per rank stay 7/8 of the sequence's K/V; Ulysses' fall as 1/cp
    r8 = context_cost(LLAMA, cluster("H100-80GB", nodes=2), sim.Plan(cp=8, dp=2)).bytes["forward"]
    u8 = context_cost(LLAMA, cluster("H100-80GB", nodes=2), sim.Plan(cp=8, dp=2, cp_kind="ulysses")).bytes["forward"]
    assert r8 == 7 * 2 * (32768 // 8) * 4096 * 2 and u8 == uly.bytes["forward"] // 2


def test_activation_memory_is_divided_by_cp():
    for cp, kind in ((2, "ring"), (4, "ulysses")):
        plan = sim.Plan(tp=2, cp=cp, sequence_parallel=True, recompute="selective", cp_kind=kind)
        want = activation_bytes_per_layer(32768, 1, 4096, 32, tp=2, sp=True, recompute="selective") / cp
        assert context_cost(LLAMA, cluster("H100-80GB", nodes=2), plan).activation_bytes == want


def test_group_sits_on_nvlink_until_it_leaves_the_node():
    assert cp_ranks(sim.Plan(tp=2, cp=4)) == [0, 2, 4, 6]
    assert context_cost(LLAMA, cluster("H100-80GB", nodes=2), sim.Plan(tp=2, cp=4, dp=2)).link.kind == "nvlink"
    cross = context_cost(LLAMA, cluster("H100-80GB", nodes=2), sim.Plan(tp=8, cp=2))
    assert cross.link.kind == "ib" and cross.link.bandwidth == cluster("H100-80GB", nodes=2).ib_bw_per_gpu


def test_ring_hides_its_sends_from_s_star_on():
    # forward: a send of 2·b·(s/cp)·(h/tp)·e bytes against a block of 4·b·s²·h/(tp·cp²) FLOPs; with
    # no latency the send is hidden iff s ≥ s* = cp·F·e/(2·B), F the GEMM rate and B the link's
    c, plan = cluster("H100-80GB", nodes=2), sim.Plan(cp=8, dp=2)
    rate = c.gpu.peak_flops * dict(NO_ALPHA.efficiency_by_gpu)["H100-80GB"]  # the H100's fitted GEMM share
    bw = c.nvlink_bw * NO_ALPHA.nvlink_efficiency
    s_star = 8 * rate * 2 / (2 * bw)
    below, above = (sim.Model("m", 2, 4096, 32, 32000, seq=s) for s in (4096, 16 * math.ceil(s_star / 16) + 4096))
    assert s_star > 4096
    low = context_cost(below, c, plan, NO_ALPHA)
    t_send = 2 * (4096 // 8) * 4096 * 2 / bw
    t_block = 4 * 4096 ** 2 * 4096 / 8 ** 2 / rate
    assert low.exposed["forward"] == pytest.approx(7 * (t_send - t_block), rel=1e-12)
    assert low.exposed["backward"] == pytest.approx(7 * (2 * t_send - 2 * t_block) + t_send, rel=1e-12)
    high = context_cost(above, c, plan, NO_ALPHA)
    assert high.exposed["forward"] == 0
    assert high.exposed["backward"] == pytest.approx(high.comm["backward"] / 15, rel=1e-12)  # the last dK/dV home


def test_ulysses_time_is_four_all_to_alls_per_pass():
    c, costs = cluster("H100-80GB", nodes=2), sim.Costs()
    cost = context_cost(LLAMA, c, sim.Plan(cp=4, dp=4, cp_kind="ulysses"), costs)
    size = (32768 // 4) * 4096 * 2
    one = 3 * costs.alpha_nvlink + 3 / 4 * size / (c.nvlink_bw * costs.nvlink_efficiency)
    assert cost.comm["forward"] == pytest.approx(4 * one, rel=1e-12)
    assert cost.exposed == cost.comm
    assert cost.step_exposed(32, 2) == pytest.approx(32 * 2 * 8 * one, rel=1e-12)


def test_constraints_name_the_numbers():
    with pytest.raises(ValueError, match="sequence length 2048 must divide by 2·cp = 4096"):
        context_cost(sim.Model("m", 2, 4096, 32, 100, seq=2048), cluster("H100-80GB", nodes=2), sim.Plan(cp=2048))
    with pytest.raises(ValueError, match="heads = 4 is not divisible .* cp = 8"):
        context_cost(LLAMA, cluster("H100-80GB", nodes=2), sim.Plan(tp=8, cp=8, cp_kind="ulysses"))
    with pytest.raises(ValueError, match="cp_kind"):
        sim.Plan(cp=2, cp_kind="stripes")


def test_plan_counts_cp_in_the_world_and_simulate_refuses_it():
    plan = sim.Plan(tp=2, cp=4, dp=2, micro_batch_size=1, num_microbatches=4)
    assert plan.world_size == 16 and plan.global_batch == 8   # a cp group shares its sequences
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4}
    read = sim.Plan.from_deepspeed(config, 16, tp=2, cp=4)
    assert (read.tp, read.cp, read.dp, read.num_microbatches, read.world_size) == (2, 4, 2, 4, 16)
    with pytest.raises(ValueError, match="does not schedule context parallelism"):
        sim.simulate(LLAMA, cluster("H100-80GB", nodes=2), plan)
