"""sim.step.lowering + sim.step.simulate: the schedule honours every dependency and stream, ZeRO's communication
volumes come out as the theory says, and the optimizer step waits where it must."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import sim
import sim.step.idle
from sim.cost.flops import head_forward_flops, layer_forward_flops
from sim.cost.work import Adam, Collective
from sim.step.graph import KINDS, STREAMS
from tests.sim.helpers import cluster

MODEL = sim.Model.preset("gpt3-350m")  # 24 layers


def run(costs=None, **plan):
    plan = sim.Plan(**plan)
    return sim.simulate(MODEL, cluster(world=plan.world_size), plan, costs)


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 4]),
       zero=st.integers(0, 3), k=st.integers(1, 3), offload=st.sampled_from(["none", "cpu", "nvme", "nvme+param"]),
       schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]), overlap=st.booleans(), sp=st.booleans(),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_every_node_starts_after_its_dependencies_and_its_stream(tp, pp, dp, zero, k, offload, schedule, overlap,
                                                                  sp, recompute):
    if tp * pp * dp > 16:
        return
    opt = "none" if zero == 0 else "cpu" if zero < 3 and offload != "none" else offload.split("+")[0]
    param = "nvme" if zero == 3 and offload == "nvme+param" else "none"
    r = run(tp=tp, pp=pp, dp=dp, zero_stage=zero, num_microbatches=k * pp, schedule=schedule,
            virtual=2 if schedule == "interleaved" else 1, overlap_comm=overlap, offload_optimizer=opt,
            offload_param=param, sequence_parallel=sp and tp > 1, recompute=recompute)
    g, start, end = r.graph, r.start, r.end
    assert np.all(end >= start)
    last = {}
    for i, deps in enumerate(g.deps):
        assert all(d < i and end[d] <= start[i] for d in deps)  # topological, and waits for its inputs
        key = (g.stage[i], g.stream[i])
        if key in last:
            assert start[i] >= end[last[key]]  # a stream runs one node at a time, in creation order
        last[key] = i
    assert r.step_time == end.max()
    busy = {s: sum(end[i] - start[i] for i in range(len(g)) if STREAMS[g.stream[i]] == s and g.stage[i] == 0)
            for s in STREAMS}
    assert busy == pytest.approx({s: r.busy[s][0] for s in STREAMS})


def dp_wire_bytes(r, stage=0):
    """Bytes one rank sends for DP/ZeRO collectives (ring volumes: AR 2(n−1)/n·S, RS/AG (n−1)/n·S)."""
    g, n, total = r.graph, r.plan.dp, 0.0
    for i in range(len(g)):
        work = g.works[g.work[i]]
        if isinstance(work, Collective) and work.axis == "dp" and g.stage[i] == stage:
            total += work.count * work.nbytes * (n - 1) / n * (2 if work.op == "all_reduce" else 1)
    return total


@pytest.mark.parametrize("dp", [2, 8])
def test_deepspeeds_stages_1_to_3_move_one_and_a_half_times_the_bytes_of_stage_0(dp):
    """DeepSpeed: stage 0 moves 2Ψ per step (all-reduce), stages 1–2 3Ψ (all-reduce + all-gather),
    stage 3 3Ψ (two all-gathers + reduce-scatter). The ZeRO paper's stages 1–2 (framework 'zero_ref',
    reduce-scatter + all-gather) move 2Ψ."""
    vol = [dp_wire_bytes(run(dp=dp, zero_stage=z, num_microbatches=1)) for z in range(4)]
    paper = [dp_wire_bytes(run(dp=dp, zero_stage=z, num_microbatches=1, framework="zero_ref")) for z in range(4)]
    psi_bytes = MODEL.num_params * 2 * (dp - 1) / dp
    assert vol == pytest.approx([2 * psi_bytes] + [3 * psi_bytes] * 3)
    assert paper == pytest.approx([2 * psi_bytes] * 3 + [3 * psi_bytes])


def test_gradient_accumulation_reduces_once_for_stages_0_1_but_every_microbatch_for_2_3():
    one = [dp_wire_bytes(run(dp=4, zero_stage=z, num_microbatches=1)) for z in range(4)]
    four = [dp_wire_bytes(run(dp=4, zero_stage=z, num_microbatches=4)) for z in range(4)]
    psi = MODEL.num_params * 2 * 3 / 4
    assert four[0] == pytest.approx(one[0]) and four[1] == pytest.approx(one[1])
    assert four[2] == pytest.approx(4 * 2 * psi + psi)  # an all-reduce per micro-batch + one all-gather
    assert four[3] == pytest.approx(4 * 3 * psi)        # gather F, gather B, reduce-scatter per micro-batch


def test_overlap_hides_gradient_reduction_behind_backward():
    on, off = (run(dp=8, zero_stage=2, num_microbatches=1, overlap_comm=o, reduce_bucket_size=10**7)
               for o in (True, False))
    assert on.busy["dp_comm"][0] == pytest.approx(off.busy["dp_comm"][0], rel=0.05)
    assert on.step_time < off.step_time


@pytest.mark.parametrize("zero", [2, 3])
def test_without_overlap_a_micro_steps_reduction_holds_up_the_next_one(zero):
    """DeepSpeed without overlap_comm reduces ZeRO-2/3 gradients on the compute stream
    (stage_1_and_2.py, DeepSpeedZeroOptimizer.average_tensor): no micro-step's forward starts before
    the previous micro-step's reduce-scatters end. With overlap_comm, ZeRO-2's run beside it."""
    for overlap in (False, True):
        r = run(dp=8, zero_stage=zero, num_microbatches=4, overlap_comm=overlap)
        g = r.graph
        kinds = [KINDS[k] for k in g.kind]
        reduces = [i for i in range(len(g)) if kinds[i] == "grad_reduce"]
        forwards = [i for i in range(len(g)) if kinds[i] == "forward"]
        late = [(f, x) for x in reduces for f in forwards
                if g.mb[f] == g.mb[x] + 1 and r.start[f] < r.end[x] - 1e-12]
        if not overlap:
            assert not late, (zero, late[:3])
        elif zero == 2:  # (ZeRO-3's next gathers queue behind the reduce-scatters on their stream anyway)
            assert late


def test_gradient_clipping_makes_every_stage_wait_for_the_slowest():
    for clip in (1.0, 0.0):
        r = run(pp=4, dp=2, num_microbatches=8, gradient_clipping=clip)
        g = r.graph
        starts = [min(r.start[i] for i in range(len(g)) if KINDS[g.kind[i]] == "optimizer" and g.stage[i] == s)
                  for s in range(4)]
        if clip:
            assert max(starts) - min(starts) < 1e-3 * r.step_time  # the global norm synchronises them
        else:
            assert starts[3] < starts[0]  # the last stage finishes its backwards first and steps early


def test_cpu_offload_moves_gradients_down_and_parameters_up_over_pcie():
    r = run(dp=8, zero_stage=2, num_microbatches=1, offload_optimizer="cpu")
    g, shard = r.graph, MODEL.num_params / 8
    def amount(w):
        return w.params if isinstance(w, Adam) else w.nbytes

    moved = {k: sum(amount(g.works[g.work[i]]) for i in range(len(g)) if KINDS[g.kind[i]] == k and g.stage[i] == 0)
             for k in ("d2h", "h2d", "cpu_adam")}
    assert moved["d2h"] == pytest.approx(2 * shard) and moved["h2d"] == pytest.approx(2 * shard)
    assert moved["cpu_adam"] == pytest.approx(shard)
    assert r.busy["cpu"][0] > 0 and r.busy["compute"][0] > 0
    assert "optimizer" not in {KINDS[k] for k in g.kind}  # no GPU Adam


def test_events_and_results():
    r = run(tp=2, pp=2, dp=2, zero_stage=1, num_microbatches=4)
    ev = r.events
    assert len(ev) == len(r.graph)
    assert {e.stream for e in ev} >= {"compute", "tp_comm", "dp_comm", "pp_comm"}
    first = next(e for e in ev if e.kind == "forward")
    assert (first.name, first.stage, first.start) == ("F0 layer 0", 0, 0.0)
    assert 0 < r.mfu < 1 and r.hfu == pytest.approx(r.mfu)  # no recomputation: the GPUs run the model's FLOPs
    full = run(tp=2, pp=2, dp=2, num_microbatches=4, recompute="full")  # + a forward of every layer
    f, h = MODEL.layers * layer_forward_flops(MODEL, 1), head_forward_flops(MODEL, 1)
    assert full.hfu / full.mfu == pytest.approx((4 * f + 3 * h) / (3 * f + 3 * h))
    assert r.tflops_per_gpu == pytest.approx(r.mfu * 312)
    assert 0 <= r.bubble_fraction < 1 and r.fits
    assert "ZeRO-1" in r.summary()


# ---------------------------------------------------------------- idle time by cause


def union_length(intervals):
    total, hi = 0.0, -np.inf
    for a, b in sorted(intervals):
        if b > hi:
            total += b - max(a, hi)
            hi = b
    return total


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 8]),
       zero=st.integers(0, 3), k=st.integers(1, 3), offload=st.sampled_from(["none", "cpu", "nvme+param"]),
       schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]), overlap=st.booleans(),
       engine=st.sampled_from(["list", "events"]))
def test_idle_causes_add_up_to_the_idle_time_of_every_stage(tp, pp, dp, zero, k, offload, schedule, overlap, engine):
    if tp * pp * dp > 16:
        return
    opt = "none" if zero == 0 or offload == "none" else "cpu" if zero < 3 else offload.split("+")[0]
    plan = sim.Plan(tp=tp, pp=pp, dp=dp, zero_stage=zero, num_microbatches=k * pp, schedule=schedule,
                    virtual=2 if schedule == "interleaved" else 1, overlap_comm=overlap, offload_optimizer=opt,
                    offload_param="nvme" if zero == 3 and offload == "nvme+param" else "none")
    cl = sim.Cluster.preset("A100-80GB", nodes=plan.world_size, gpus_per_node=1)  # everything on IB
    r = sim.simulate(MODEL, cl, plan, engine=engine,
                     contention=sim.Contention.for_plan(cl, plan, pcie="fair") if engine == "events" else None)
    total = sum(r.idle.values())
    assert set(r.idle) == set(sim.step.idle.CAUSES)
    assert all(np.all(v >= -1e-12 * r.step_time) for v in r.idle.values())
    assert total == pytest.approx(r.step_time - r.busy["compute"], rel=1e-12, abs=1e-12 * r.step_time)
    if opt == "none":
        assert not r.idle["offload_stall"].any()
    if pp == 1:
        assert not r.idle["fill_drain"].any() and not r.idle["p2p_wait"].any()


@pytest.mark.parametrize("schedule,p,m", [("1f1b", 4, 8), ("1f1b", 8, 3), ("gpipe", 3, 5), ("1f1b", 2, 1)])
def test_free_communication_leaves_only_fill_and_drain_equal_to_the_closed_form(schedule, p, m):
    model = sim.Model("uniform", layers=2 * p, hidden=256, heads=8, vocab=1000, seq=128)
    plan = sim.Plan(tp=2, pp=p, dp=2, zero_stage=1, num_microbatches=m, schedule=schedule)
    cl = sim.Cluster.preset("A100-80GB", nodes=plan.world_size, gpus_per_node=1)
    r = sim.simulate(model, cl, plan, sim.Costs.compute_only(), head=False)
    closed = sim.bubble_fraction(p, m) * r.step_time
    assert r.idle["fill_drain"] == pytest.approx([closed] * p, rel=1e-12)
    for cause in ("p2p_wait", "exposed_comm", "offload_stall", "memory_wait"):
        assert not r.idle[cause].any()
    assert "fill/drain" in r.summary().splitlines()[1]


def test_exposed_comm_is_the_collective_time_compute_does_not_hide():
    """Data parallelism only, slow InfiniBand, gradients reduced after the backward: the compute
    stream's idle time is all exposed communication, equal to the time the DP collectives run
    while no compute does (the measure of their intervals outside the compute intervals)."""
    plan = sim.Plan(dp=8, zero_stage=2, num_microbatches=2, overlap_comm=False, reduce_bucket_size=10**7,
                    allgather_bucket_size=10**7)
    cl = sim.Cluster.preset("A100-80GB", nodes=8, gpus_per_node=1, ib_bw=12.5e9)
    r = sim.simulate(MODEL, cl, plan)
    comm = [(e.start, e.end) for e in r.events if e.stream == "dp_comm"]
    compute = [(e.start, e.end) for e in r.events if e.stream == "compute"]
    hidden = union_length(comm + compute) - union_length(compute)  # comm time outside compute
    assert r.idle["exposed_comm"][0] > 0.3 * r.step_time
    assert r.idle["exposed_comm"][0] == pytest.approx(hidden, rel=1e-12)
    assert r.idle["exposed_comm"][0] == pytest.approx(r.step_time - r.busy["compute"][0], rel=1e-12)
    assert union_length(comm) > hidden  # some of it is hidden: parameter all-gathers under the optimizer
    on = sim.simulate(MODEL, cl, sim.Plan(**{**plan.__dict__, "overlap_comm": True}))
    assert on.idle["exposed_comm"][0] < r.idle["exposed_comm"][0]


def test_offload_stall_and_memory_wait():
    r = run(dp=8, zero_stage=2, num_microbatches=1, offload_optimizer="cpu")
    assert r.idle["offload_stall"][0] > 0.2 * r.step_time  # CPU Adam and PCIe after the backward
    assert "offload stall" in r.summary()
    # a GPU half a layer's gradients smaller than ZeRO-2's peak (full recomputation: the gradient
    # buckets dominate): a backward waits for the previous bucket's reduce-scatter to free it
    plan = sim.Plan(dp=8, zero_stage=2, num_microbatches=1, recompute="full",
                    reduce_bucket_size=int(MODEL.num_params / 24))
    ib = sim.Cluster.preset("A100-80GB", nodes=8, gpus_per_node=1)
    free = sim.simulate(MODEL, ib, plan, granularity="layer")
    layer = 2 * MODEL.num_params / 24
    small = sim.Cluster.preset("A100-80GB", nodes=8, gpus_per_node=1, hbm_bytes=free.peak_gpu_bytes - layer / 2)
    tight = sim.simulate(MODEL, small, plan, granularity="layer", engine="events",
                         contention=sim.Contention.for_plan(small, plan, hbm=True))
    assert tight.fits and not sim.simulate(MODEL, small, plan, granularity="layer").fits
    assert tight.idle["memory_wait"][0] > 0 and not free.idle["memory_wait"].any()
    assert tight.step_time > free.step_time
    assert sum(tight.idle.values())[0] == pytest.approx(tight.step_time - tight.busy["compute"][0], rel=1e-12)
