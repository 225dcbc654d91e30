"""Context parallelism: sim.cost.context against closed forms (bytes, links, activation memory, when the
ring hides its traffic), and the simulated step with cp against zero_ref's byte counts and those costs.

Exact (==) where the quantity is a count of bytes; 1e-12 relative where it is seconds (one float
division apart from the closed form).
"""
import math

import pytest

import sim
from sim.cost.context import context_cost, cp_ranks
from sim.cost.cost_model import CostModel
from sim.step.graph import STREAMS
from sim.step.list_schedule import list_schedule
from sim.views.trace import chrome_trace
from zero_ref.memory import activation_bytes_per_layer
from zero_ref.parallel.context import ring_bytes, ulysses_bytes
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


def test_plan_counts_cp_in_the_world_and_simulate_runs_it():
    plan = sim.Plan(tp=2, cp=4, dp=2, micro_batch_size=1, num_microbatches=4)
    assert plan.world_size == 16 and plan.global_batch == 8   # a cp group shares its sequences
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4}
    read = sim.Plan.from_deepspeed(config, 16, tp=2, cp=4)
    assert (read.tp, read.cp, read.dp, read.num_microbatches, read.world_size) == (2, 4, 2, 4, 16)
    assert "cp" not in plan.to_deepspeed() and sim.Plan.from_deepspeed(plan.to_deepspeed(), 16, tp=2, cp=4) == plan
    result = sim.simulate(LLAMA, cluster("H100-80GB", nodes=2), plan)
    assert "tp 2 cp 4 (ring) pp 1 dp 2" in result.summary()
    assert result.busy["cp_comm"][0] > 0


GQA = sim.Model("gqa", layers=8, hidden=4096, heads=32, vocab=32000, seq=16384, gated=True, kv_heads=8, dropout=False)


def cp_bytes_per_stage(result) -> list[float]:
    """Bytes each stage's rank hands to its cp group in the simulated step."""
    g, out = result.graph, [0.0] * result.plan.pp
    for i in range(len(g)):
        if STREAMS[g.stream[i]] == "cp_comm":
            w = g.works[g.work[i]]
            out[g.stage[i]] += w.nbytes * w.count
    return out


@pytest.mark.parametrize("kind", ["ring", "ulysses"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_step_cp_bytes_are_zero_refs_counts(kind, recompute):
    # zero_ref.parallel.context's counts (checked against the real ring and Ulysses runs in
    # tests/zero_ref/test_context_parallel.py) × layers × micro-batches, the forward's twice under full recompute
    plan = sim.Plan(tp=2, cp=4, pp=2, dp=2, num_microbatches=4, schedule="interleaved", virtual=2,
                    cp_kind=kind, recompute=recompute, zero_stage=1, attention="flash")
    result = sim.simulate(GQA, cluster("H100-80GB", nodes=4), plan)
    d, heads, kv = 4096 // 32, 32 // 2, 8 // 2
    per = (ring_bytes(1, 16384, kv, d, 4) if kind == "ring"
           else ulysses_bytes(1, 16384, heads, d, 4, kv_heads=kv))
    layer = per["forward"] * (2 if recompute == "full" else 1) + per["backward"]
    assert cp_bytes_per_stage(result) == [8 // 2 * 4 * layer] * 2   # 4 layers per stage, 4 micro-batches


@pytest.mark.parametrize("seq", [4096, 65536])
@pytest.mark.parametrize("kind", ["ring", "ulysses"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_step_exposes_what_context_cost_prices(seq, kind, recompute):
    # the step minus the same graph timed with its cp traffic free is the exposed time context_cost
    # prices per layer (short sequences: the ring's sends show; long ones: only the last dK/dV)
    model = sim.Model("m", layers=4, hidden=4096, heads=32, vocab=32000, seq=seq)
    c = cluster("H100-80GB", nodes=1)
    plan = sim.Plan(cp=8, num_microbatches=3, cp_kind=kind, recompute=recompute, gradient_clipping=0.0)
    cost = context_cost(model, c, plan)
    want = cost.step_exposed(4, 3, recompute)
    for granularity in ("layer", 2):
        g = sim.simulate(model, c, plan, granularity=granularity).graph
        durations = CostModel(c, plan).durations(g.works)
        # the gradient all-reduce over the dp·cp ranks is left out of both: it could hide a tail
        ends = [list_schedule(g, [0.0 if getattr(w, "axis", None) in free else t
                                  for w, t in zip(g.works, durations)])[1].max() for free in (("dp",), ("dp", "cp"))]
        assert ends[0] - ends[1] == pytest.approx(want, rel=1e-9)
    hidden = cost.exposed["forward"] == 0
    assert hidden == (kind == "ring" and seq == 65536)


@pytest.mark.parametrize("kind", ["ring", "ulysses"])
def test_activation_peak_falls_as_one_over_cp(kind):
    c = cluster("H100-80GB", nodes=4)
    base = dict(tp=2, pp=2, num_microbatches=4, sequence_parallel=True, recompute="selective", cp_kind=kind)
    one = sim.simulate(GQA, c, sim.Plan(dp=8, **base))
    for cp in (2, 4):
        split = sim.simulate(GQA, c, sim.Plan(cp=cp, dp=8 // cp, **base))
        for s in range(2):
            assert split.peak_memory[s]["activation"] == pytest.approx(one.peak_memory[s]["activation"] / cp,
                                                                       rel=1e-12)


def test_zero_shards_and_gradients_span_dp_times_cp():
    # the ranks of a cp group hold the same parameters: ZeRO shards over dp·cp, as over dp = dp·cp
    c = cluster("H100-80GB", nodes=2)
    with_cp = sim.simulate(GQA, c, sim.Plan(zero_stage=3, tp=2, cp=4, dp=2))
    without = sim.simulate(GQA, c, sim.Plan(zero_stage=3, tp=2, dp=8))
    for cat in ("param", "grad", "optim"):
        assert with_cp.peak_memory[0][cat] == without.peak_memory[0][cat]
    cm = CostModel(c, sim.Plan(tp=8, cp=2))
    assert cm.links["cp"] == context_cost(GQA, c, sim.Plan(tp=8, cp=2)).link
    assert cm.links["cp"].kind == cm.links["dp"].kind == "ib" and cm.links["dp"].size == 2
    assert CostModel(c, sim.Plan(tp=2, cp=4, dp=2)).links["cp"].kind == "nvlink"


def test_cp_composes_with_zero3_pipelines_and_the_event_engine():
    plan = sim.Plan(zero_stage=3, tp=2, cp=2, pp=2, dp=2, num_microbatches=4, schedule="interleaved", virtual=2,
                    recompute="full", sequence_parallel=True, attention="flash")
    c = cluster("H100-80GB", nodes=2)
    lst, ev = (sim.simulate(GQA, c, plan, engine=e) for e in ("list", "events"))
    assert lst.step_time > 0 and ev.step_time >= lst.step_time * (1 - 1e-12)
    assert all(b > 0 for b in lst.busy["cp_comm"])
    cp_thread = STREAMS.index("cp_comm") + 1
    spans = [e for e in chrome_trace(lst)["traceEvents"] if e.get("ph") == "X" and e["tid"] == cp_thread]
    assert spans and {e["pid"] for e in spans} == {0, 8}   # stage 1 starts at rank tp·cp·dp = 2·2·2
    idle = sum(float(v.sum()) for v in lst.idle.values())
    assert idle == pytest.approx(float((lst.step_time - lst.busy["compute"]).sum()), rel=1e-9)


def test_llama3_405b_cp16_row_is_simulated_held_out():
    # Table 4's long-context row: 16,384 H100s, TP 8 × CP 16 × PP 16 × DP 8, 131,072 tokens; not in any fit
    from sim.calibration import calibrate, published_hopper as hop
    (run,) = hop.LLAMA3_405B_CP
    assert run not in hop.HOPPER and run.dp == 8 and run.global_batch * run.seq == 2**24  # 16M tokens
    plan = run.plan()
    assert (plan.tp, plan.cp, plan.pp, plan.dp, plan.world_size) == (8, 16, 16, 8, 16384)
    error = calibrate.predict(run, sim.Costs()) / run.measured_time - 1
    assert abs(error) <= 0.20   # the held-out bound (−12.8 % at the default constants)


def test_cp_across_nodes_shares_the_nic_in_the_event_engine():
    # TP 8 fills a node, so the cp ring and the dp·cp gradient reduce both leave it over InfiniBand
    from sim.step.event_schedule import Contention
    c, plan = cluster("H100-80GB", nodes=4), sim.Plan(tp=8, cp=2, dp=2, num_microbatches=2, attention="flash")
    (link,) = Contention.for_plan(c, plan).links
    assert link.streams == ("dp_comm", "cp_comm")
    lst, ev = (sim.simulate(GQA, c, plan, engine=e) for e in ("list", "events"))
    assert ev.step_time >= lst.step_time * (1 - 1e-12)


@pytest.mark.parametrize("attention", ["eager", "flash"])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_ring_block_is_the_steps_attention_block(attention, recompute):
    # context_cost times a ring block as sim.simulate does: FlashAttention's causal kernels at their own
    # rate ('flash'), the full s² as GEMMs ('eager'); backward with what it recomputes
    model = sim.Model("m", layers=2, hidden=4096, heads=32, vocab=32000, seq=16384)
    c = cluster("H100-80GB", nodes=1)
    plan = sim.Plan(cp=8, num_microbatches=1, attention=attention, recompute=recompute)
    cost = context_cost(model, c, plan)
    blocks = sorted({round(e.end - e.start, 15) for e in sim.simulate(model, c, plan).events if e.kind == "attention"})
    assert len(blocks) == 2    # a forward block, a backward block
    assert blocks == pytest.approx([cost.attention["forward"] / 8, cost.attention["backward"] / 8], rel=1e-9)
