"""ZeRO++ in the simulator: each link's bytes are the paper's and zero_ref's, hpZ's memory, the planner picks it."""
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.calibration import calibrate
from sim.planning.bounds import memory_lower_bound, time_lower_bound
from sim.planning.search import Space, describe, granularity_for, search
from sim.spec.plan import Plan
from sim.cost.work import Compute
from sim.step.graph import STREAMS
from sim.step.lowering import build_graph
from sim.step.memory_timeline import static_bytes
from sim.step.traffic import bytes_by_link
from tests.sim.helpers import cluster
from zero_ref.stages.zero3.block_quant import quantized_bytes
from zero_ref.stages.zero3.quantized_reduce import BLOCK
from zero_ref.volume import dp_bytes_per_step, zeropp_cross_node_bytes

N, G = 16, 8            # two nodes of eight GPUs, hpZ over a node
M = N // G
MODEL = sim.Model.preset("gpt3-125m")
PSI, L = MODEL.num_params, MODEL.layers
P = PSI / L             # one layer: a gather unit and (reduce_bucket_size=1) a gradient bucket
ALL = dict(zero_quantized_weights=True, zero_hpz_partition_size=G, zero_quantized_gradients=True)
COSTS = calibrate.calibrate()


def plan(**kw):
    return Plan(zero_stage=3, dp=N, reduce_bucket_size=1, **kw)


def links(p):
    """{'nvlink' | 'ib': bytes} one rank sends per step."""
    return bytes_by_link(build_graph(MODEL, p, granularity="layer"), p, cluster(nodes=2))


def ring(n):
    return (n - 1) / n


def int8_gather(n):
    """A layer's qwZ all-gather over n ranks: the full buffer as zero_ref's quantized_gather sends it (its
    docstring's count, which tests/zero_ref/test_zeropp.py measures): n shards of int8 + DeepSpeed's scales."""
    return n * quantized_bytes(round(P / n), 8)


def test_plain_zero3_sends_3m_across_nodes():
    got = links(plan())
    assert got.get("nvlink", 0.0) == 0.0
    assert got["ib"] == pytest.approx(dp_bytes_per_step(PSI, zero_stage=3, dp=N), rel=1e-12)
    assert got["ib"] == pytest.approx(zeropp_cross_node_bytes(PSI, dp=N, node=G, quantized_weights=False, hpz=False,
                                                              quantized_gradients=False), rel=1e-12)


def test_hpz_keeps_the_backward_gathers_in_the_node():
    got = links(plan(zero_hpz_partition_size=G))
    assert got["ib"] == pytest.approx(ring(N) * PSI * (2 + 2), rel=1e-12)   # forward's gathers + reduce-scatter
    assert got["nvlink"] == pytest.approx(ring(G) * PSI * 2, rel=1e-12)      # backward's, in the sub-group


def test_all_three_each_link_carries_zero_refs_counts_and_the_papers():
    got = links(plan(**ALL))
    s = P / N
    qgz_inside = quantized_bytes(round(M * s), 4, rows=G, block=BLOCK)   # zero_ref's qgZ step 1 (one bucket)
    qgz_across = quantized_bytes(round(s), 4, rows=M, block=BLOCK)       # step 2
    assert got["ib"] == pytest.approx(L * (ring(N) * int8_gather(N) + ring(M) * qgz_across), rel=1e-12)
    assert got["nvlink"] == pytest.approx(L * (ring(G) * int8_gather(G) + ring(G) * qgz_inside), rel=1e-12)
    # the paper's closed form leaves out the scales and the padding: 4 bytes per block, 8000 int8 (5e-4 of the
    # gathers) and 512 int4 (1/64 of qgZ's bytes, which are 1/30 of the total here: 5e-4): together 1e-3 over
    paper = zeropp_cross_node_bytes(PSI, dp=N, node=G)
    assert 0 < got["ib"] / paper - 1 < 1.1e-3
    assert got["ib"] / dp_bytes_per_step(PSI, zero_stage=3, dp=N) < 0.2


def test_the_closed_form_is_the_papers_3m_to_0_75m():
    mb = 2 * PSI  # the paper's M: the model in fp16
    f = ring(N)
    full = zeropp_cross_node_bytes(PSI, dp=N, node=G, quantized_weights=False, hpz=False, quantized_gradients=False)
    assert full == pytest.approx(3 * mb * f)
    qw = zeropp_cross_node_bytes(PSI, dp=N, node=G, hpz=False, quantized_gradients=False)
    assert full - qw == pytest.approx(2 * 0.5 * mb * f)                  # both gathers halved
    hp = zeropp_cross_node_bytes(PSI, dp=N, node=G, quantized_gradients=False)
    assert qw - hp == pytest.approx(0.5 * mb * f)                        # backward's gone
    alls = zeropp_cross_node_bytes(PSI, dp=N, node=G)
    per_node_gradient = G * (alls - 0.5 * mb * f)
    assert per_node_gradient == pytest.approx(0.25 * mb * ring(M))       # Ψ/2 bytes leave a node
    with pytest.raises(ValueError, match="node=3 must divide dp=16"):
        zeropp_cross_node_bytes(PSI, dp=N, node=3)


def test_hpz_holds_the_secondary_shard_and_the_kernels_are_on_the_compute_stream():
    plain, hpz = static_bytes(MODEL, plan()), static_bytes(MODEL, plan(zero_hpz_partition_size=G))
    assert hpz["gpu"]["param"] - plain["gpu"]["param"] == pytest.approx(2 * PSI / G)  # 16-bit, over the node

    def hbm(p):
        """HBM bytes of the compute stream's work in one step."""
        g = build_graph(MODEL, p, granularity="layer")
        return sum(g.works[g.work[i]].hbm_bytes for i in range(len(g)) if STREAMS[g.stream[i]] == "compute"
                   and isinstance(g.works[g.work[i]], Compute))
    # per layer: qwZ's forward gather (n = N) and backward's (n = G): quantize the shard (read 2, write 1 byte
    # an element), dequantize the buffer (read 1, write 2); qgZ's bucket: 2 + 0.5 (quantize), 0.5 + 4/G (step 1),
    # 4.5/G (requantize), 0.5/G + 4/N (step 2)
    qwz = 3 * P * (1 + 1 / N) + 3 * P * (1 + 1 / G)
    qgz = P * (2.5 + 0.5 + 4 / G + 4.5 / G + 0.5 / G + 4 / N)
    assert hbm(plan(**ALL)) - hbm(plan(zero_hpz_partition_size=G)) == pytest.approx(L * (qwz + qgz), rel=1e-9)


def test_plan_fields_checks_and_the_deepspeed_round_trip():
    p = plan(**ALL)
    zero = p.to_deepspeed()["zero_optimization"]
    assert (zero["zero_quantized_weights"], zero["zero_hpz_partition_size"], zero["zero_quantized_gradients"]) == \
        (True, G, True)
    assert Plan.from_deepspeed(p.to_deepspeed(), N) == p
    assert "zero_quantized_weights" not in plan().to_deepspeed()["zero_optimization"]
    cfg = {"train_batch_size": 16, "zero_optimization": {"stage": 2, "zero_quantized_weights": True}}
    assert not Plan.from_deepspeed(cfg, N).zero_quantized_weights        # DeepSpeed's ZeRO++ is stage 3's
    with pytest.raises(ValueError, match="Plan.zero_hpz_partition_size=3 does not divide"):
        plan(zero_hpz_partition_size=3)
    with pytest.raises(ValueError, match="Plan.zero_quantized_gradients .*zero_stage=3"):
        Plan(zero_stage=2, dp=N, zero_quantized_gradients=True)
    with pytest.raises(ValueError, match="Plan.zero_quantized_weights .*framework='deepspeed'"):
        Plan(zero_stage=3, dp=N, framework="fsdp2", zero_quantized_weights=True)
    with pytest.raises(ValueError, match="Plan.zero_quantized_weights must be True or False"):
        plan(zero_quantized_weights=1)


def test_the_planner_chooses_zeropp_over_slow_infiniband():
    slow = cluster("A100-80GB", nodes=2, ib_bw=25e9)  # 3 GB/s a GPU across nodes
    space = Space(zero_stages=(3,), tp=(1,), pp=(1,), micro_batch_sizes=(4,), recompute=("none",),
                  offload=(("none", "none"),), zeropp=True)
    result = search(MODEL, slow, 64, space, top=None)
    fits = [r for r in result.rows if r.status == "fits"]
    best = fits[0].plan
    assert best.zero_quantized_weights and best.hpz == G and best.zero_quantized_gradients
    assert "qwZ hpZ8 qgZ" in describe(best)
    plain = min(r.step_time for r in fits if not r.plan.zeropp)
    assert fits[0].step_time < 0.7 * plain


def test_the_trace_names_zeropps_groups():
    from sim.views.trace import chrome_trace
    r = sim.simulate(MODEL, cluster(nodes=2), plan(**ALL))
    groups = {(e["args"]["Process Group Name"], e["args"]["Process Group Ranks"])
              for e in chrome_trace(r)["traceEvents"] if "Group size" in e.get("args", {})}
    assert ("dp_hpz", str(list(range(G)))) in groups and ("dp_hpz_across", str([0, G])) in groups


def test_zeropp_keeps_every_flop_of_the_layer():
    """The (de)quantize kernels add HBM bytes to a layer's compute; its FLOPs, FlashAttention's included, stay:
    the step never drops below the time lower bound, and the compute stream is busy as long as without ZeRO++."""
    from sim.planning.bounds import time_lower_bound
    model = sim.Model.preset("llama-3-8b", seq=32768)
    cluster = sim.Cluster.preset("H100-80GB", nodes=2)
    base = dict(zero_stage=3, tp=4, dp=4, num_microbatches=2, recompute="selective", sequence_parallel=True,
                attention="flash")
    plain = sim.simulate(model, cluster, sim.Plan(**base), granularity="stage")
    for kw in ({"zero_hpz_partition_size": 2},
               {"zero_quantized_weights": True, "zero_hpz_partition_size": 2, "zero_quantized_gradients": True}):
        plan = sim.Plan(**base, **kw)
        r = sim.simulate(model, cluster, plan, granularity="stage")
        assert r.step_time >= time_lower_bound(model, cluster, plan, granularity=r.graph.group_sizes[0])
        assert r.busy["compute"][0] >= plain.busy["compute"][0] * (1 - 1e-12)


zeropp_plans = st.builds(
    dict, tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), nodes=st.sampled_from([2, 4]),
    mbs=st.sampled_from([1, 2]), k=st.integers(1, 3), recompute=st.sampled_from(["none", "selective", "full"]),
    schedule=st.sampled_from(["1f1b", "interleaved"]), precision=st.sampled_from(["bf16", "fp32"]),
    qw=st.booleans(), hpz=st.booleans(), qg=st.booleans(), fine=st.booleans(), calibrated=st.booleans(),
    offload=st.sampled_from(["none", "cpu"]))


@settings(max_examples=40, deadline=None)
@given(zeropp_plans)
def test_the_bounds_hold_for_zeropp_plans(x):
    """search's pruning stays safe with ZeRO++: its time bound (each group's first gather of a step from the
    primary, the rest from hpZ's sub-group; the (de)quantize kernels on the compute stream) and memory bound
    (the secondary shard) never exceed the simulator's step and peak."""
    gpn = 8
    dp = x["nodes"] * gpn // (x["tp"] * x["pp"])
    g = gpn // x["tp"] if x["hpz"] else 1
    plan = Plan(zero_stage=3, tp=x["tp"], pp=x["pp"], dp=dp, micro_batch_size=x["mbs"],
                num_microbatches=x["k"] * x["pp"], schedule=x["schedule"] if x["pp"] > 1 else "1f1b",
                virtual=2 if x["schedule"] == "interleaved" and x["pp"] > 1 else 1, recompute=x["recompute"],
                precision=x["precision"], offload_optimizer=x["offload"], zero_quantized_weights=x["qw"],
                zero_hpz_partition_size=g, zero_quantized_gradients=x["qg"], attention="flash")
    cl = sim.Cluster.preset("A100-80GB", nodes=x["nodes"], gpus_per_node=gpn)
    costs = COSTS if x["calibrated"] else sim.Costs()
    gran = 1 if x["fine"] else granularity_for(MODEL, plan)
    r = sim.simulate(MODEL, cl, plan, costs, granularity=gran)
    assert time_lower_bound(MODEL, cl, plan, costs, granularity=gran) <= r.step_time * (1 + 1e-12)
    assert memory_lower_bound(MODEL, plan)["total"] <= r.peak_gpu_bytes * (1 + 1e-12)
