"""sim.step.event_schedule: the event-heap engine equals list scheduling bit for bit without contention, is never
faster with it, and shares a link, caps live parameters and waits for memory as documented."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.cost_model import CostModel
from sim.step.event_schedule import Contention, DoesNotFit, MemoryCap, SharedLink, event_schedule
from sim.step.graph import TaskGraph
from sim.step.list_schedule import list_schedule
from sim.step.lowering import build_graph
from sim.step.memory_timeline import memory_timeline, static_bytes
from tests.sim.helpers import cluster

MODEL = sim.Model("tiny", layers=8, hidden=256, heads=8, vocab=1000, seq=128)
BIG = sim.Model.preset("gpt3-1.3b")  # 24 layers


plans = st.fixed_dictionaries(dict(
    tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 4]),
    zero=st.integers(0, 3), k=st.integers(1, 3), schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]),
    offload=st.sampled_from(["none", "cpu", "nvme", "nvme+param", "cpu+param"]), overlap=st.booleans(),
    recompute=st.sampled_from(["none", "selective", "full"]), clip=st.sampled_from([0.0, 1.0]),
    bucket=st.sampled_from([10**5, 10**6, 5 * 10**8]), gpus_per_node=st.sampled_from([1, 2, 8]),
    granularity=st.sampled_from(["layer", "stage", 2])))


def make(cfg):
    zero, off = cfg["zero"], cfg["offload"]
    opt = "none" if zero == 0 or off == "none" else "cpu" if zero < 3 else off.split("+")[0]
    param = "cpu" if zero == 3 and off.endswith("+param") and opt == "cpu" else \
        "nvme" if zero == 3 and off == "nvme+param" else "none"
    interleaved = cfg["schedule"] == "interleaved"
    plan = sim.Plan(zero_stage=zero, tp=cfg["tp"], pp=cfg["pp"], dp=cfg["dp"], num_microbatches=cfg["k"] * cfg["pp"],
                    schedule=cfg["schedule"], virtual=2 if interleaved and cfg["pp"] > 1 else 1,
                    recompute=cfg["recompute"], offload_optimizer=opt, offload_param=param,
                    overlap_comm=cfg["overlap"], gradient_clipping=cfg["clip"], reduce_bucket_size=cfg["bucket"],
                    allgather_bucket_size=cfg["bucket"])
    cl = cluster(world=plan.world_size, gpus_per_node=cfg["gpus_per_node"])
    gran = cfg["granularity"]
    graph = build_graph(MODEL, plan, granularity=gran if MODEL.layers % (plan.pp * plan.virtual * 2) == 0 or
                        gran != 2 else "layer")
    return plan, cl, graph, CostModel(cl, plan).durations(graph.works)


@settings(max_examples=60, deadline=None)
@given(cfg=plans)
def test_without_contention_every_node_starts_and_ends_exactly_as_in_list_scheduling(cfg):
    plan, cluster, graph, durations = make(cfg)
    start, end = list_schedule(graph, durations)
    s2, e2 = event_schedule(graph, durations)
    assert np.array_equal(start, s2) and np.array_equal(end, e2)
    # caps that never bind change nothing either
    loose = Contention(caps=(MemoryCap(1e18), MemoryCap(1e18, categories=("zero3_gathered",))))
    s3, e3 = event_schedule(graph, durations, loose, static_bytes(MODEL, plan))
    assert np.array_equal(start, s3) and np.array_equal(end, e3)


def test_simulate_selects_the_engine():
    plan = sim.Plan(zero_stage=2, tp=2, pp=2, dp=2, num_microbatches=4)
    cl = cluster(world=plan.world_size)
    a = sim.simulate(MODEL, cl, plan)
    b = sim.simulate(MODEL, cl, plan, engine="events", contention=Contention())
    assert (a.engine, b.engine) == ("list", "events")
    assert np.array_equal(a.start, b.start) and np.array_equal(a.end, b.end)
    assert (a.step_time, a.bubble_fraction, a.peak_memory) == (b.step_time, b.bubble_fraction, b.peak_memory)
    with pytest.raises(ValueError, match="engine must be"):
        sim.simulate(MODEL, cl, plan, engine="heap")
    with pytest.raises(ValueError, match="engine='events'"):
        sim.simulate(MODEL, cl, plan, contention=Contention())


@settings(max_examples=40, deadline=None)
@given(cfg=plans, policy=st.sampled_from(["fair", "fifo"]), pcie=st.sampled_from([None, "fair", "fifo"]),
       live_groups=st.sampled_from([None, 1, 2, 3]), extra=st.sampled_from([None, 0.0, 0.5]))
def test_contention_never_makes_anything_earlier(cfg, policy, pcie, live_groups, extra):
    plan, cluster, graph, durations = make(cfg)
    start, end = list_schedule(graph, durations)
    links = (SharedLink("nic", ("dp_comm", "pp_comm", "tp_comm"), policy),)
    if pcie:
        links += (SharedLink("pcie", ("h2d", "d2h", "nvme"), pcie),)
    static = static_bytes(MODEL, plan)
    caps = ()
    group = max((b for b, c in zip(graph.mem_bytes, graph.mem_cat) if c == 4), default=0.0)  # zero3_gathered
    if live_groups and group:
        caps += (MemoryCap(live_groups * group, categories=("zero3_gathered",)),)
    if extra is not None:  # HBM = the list schedule's peak, less a bit: someone must wait
        peak = max(p["total"] for p in memory_timeline(graph, start, end, static).peaks())
        caps += (MemoryCap(peak * (1 - 1e-9) if extra else peak),)
    try:
        s2, e2 = event_schedule(graph, durations, Contention(links, caps), static)
    except DoesNotFit:
        return  # a tighter HBM than the schedule needs can deadlock (e.g. GPipe's forwards): reported, fine
    tol = 1e-9 * max(end.max(), 1e-30)
    assert np.all(s2 >= start - tol) and np.all(e2 >= end - tol)
    assert np.all(e2 - s2 >= end - start - tol)  # sharing stretches a transfer, never shortens it
    for c in caps:  # the caps hold
        mem = memory_timeline(graph, s2, e2, static if c.categories is None else
                              {t: dict.fromkeys(v, 0.0) for t, v in static.items()})
        for s in range(plan.pp):
            _, curves = mem.curve(s)
            held = sum(curves[k] for k in (c.categories or ("total",)))
            assert held.max() <= c.capacity * (1 + 1e-12)


def two_transfers(durations_of, streams=("dp_comm", "pp_comm")):
    """A one-stage graph: transfers on ``streams``, no dependencies, then a compute that needs all."""
    g = TaskGraph(1, 1, 1, 1)
    nodes = [g.add("grad_reduce", s, 0, ("x", k)) for k, s in enumerate(streams)]
    g.add("forward", "compute", 0, ("compute",), nodes)
    return g.finish(), durations_of


@pytest.mark.parametrize("d", [1.0, 0.5, 3e-3])
def test_two_equal_transfers_on_one_link_take_twice_as_long(d):
    g, _ = two_transfers(None)
    durations = [d, d, 0.25]
    assert list(event_schedule(g, durations)[1]) == [d, d, d + 0.25]  # separate links
    fair = Contention((SharedLink("ib", ("dp_comm", "pp_comm"), "fair"),))
    start, end = event_schedule(g, durations, fair)
    assert list(start) == [0.0, 0.0, 2 * d] and list(end) == [2 * d, 2 * d, 2 * d + 0.25]
    fifo = Contention((SharedLink("ib", ("dp_comm", "pp_comm"), "fifo"),))
    start, end = event_schedule(g, durations, fifo)
    assert list(start) == [0.0, d, 2 * d] and list(end) == [d, 2 * d, 2 * d + 0.25]


def test_fair_sharing_of_unequal_transfers():
    """1 s and 2 s of work: both at half rate until the short one ends at 2 s; the long one has
    1 s of work left, alone, so it ends at 3 s. Three equal ones end together at 3×."""
    g, _ = two_transfers(None)
    start, end = event_schedule(g, [1.0, 2.0, 0.0], Contention((SharedLink("l", ("dp_comm", "pp_comm")),)))
    assert list(end) == [2.0, 3.0, 3.0]
    g, _ = two_transfers(None, ("dp_comm", "pp_comm", "h2d"))
    _, end = event_schedule(g, [1.0, 1.0, 1.0, 0.0], Contention((SharedLink("l", ("dp_comm", "pp_comm", "h2d")),)))
    assert list(end) == [3.0, 3.0, 3.0, 3.0]


def test_zero3_live_parameter_cap_of_one_group_stops_the_prefetch():
    plan = sim.Plan(zero_stage=3, dp=8, num_microbatches=2)
    cl = cluster(world=plan.world_size)
    group = BIG.num_params / BIG.layers  # one layer per group at granularity='layer'
    free = sim.simulate(BIG, cl, plan, granularity="layer")
    capped = sim.simulate(BIG, cl, plan, granularity="layer", engine="events",
                          contention=Contention.for_plan(cl, plan, max_live_params=group))
    assert free.peak_memory[0]["zero3_gathered"] == pytest.approx(2 * 2 * group)  # in use + prefetched
    assert capped.peak_memory[0]["zero3_gathered"] == pytest.approx(2 * group)
    assert capped.step_time > free.step_time
    assert capped.idle["exposed_comm"][0] > free.idle["exposed_comm"][0]  # the gathers are now exposed
    with pytest.raises(DoesNotFit, match=r"stage 0: .*\(zero3_gathered\)"):
        sim.simulate(BIG, cl, plan, granularity="layer", engine="events",
                     contention=Contention.for_plan(cl, plan, max_live_params=group / 2))


def test_memory_pressure_delays_the_prefetch_and_the_peak_stays_under_hbm(monkeypatch):
    monkeypatch.setattr(sim.step.lowering, "BACKWARD_GATHER", "prefetch")  # gathers ahead in both passes: more to delay
    plan = sim.Plan(zero_stage=3, dp=8, num_microbatches=2)
    cl = cluster(world=plan.world_size)
    free = sim.simulate(BIG, cl, plan, granularity="layer")
    group = 2 * BIG.num_params / BIG.layers
    tight = free.peak_gpu_bytes - group / 2  # half a gathered layer short of the free-running peak
    small = sim.Cluster.preset("A100-80GB", nodes=1, gpus_per_node=8, hbm_bytes=tight)
    r = sim.simulate(BIG, small, plan, granularity="layer", engine="events",
                     contention=Contention.for_plan(small, plan, hbm=True))
    assert r.peak_gpu_bytes <= tight and r.fits and not sim.simulate(BIG, small, plan, granularity="layer").fits
    assert r.step_time > free.step_time
    with pytest.raises(DoesNotFit, match="stage 0"):
        tiny_gpu = sim.Cluster.preset("A100-80GB", nodes=1, gpus_per_node=8, hbm_bytes=free.peak_gpu_bytes / 3)
        sim.simulate(BIG, tiny_gpu, plan, granularity="layer", engine="events",
                     contention=Contention.for_plan(tiny_gpu, plan, hbm=True))


def test_dp_and_pipeline_traffic_share_the_nic_only_when_both_leave_the_node():
    across = sim.Plan(zero_stage=2, tp=1, pp=2, dp=2, num_microbatches=4)
    one_per_node = cluster(world=across.world_size, gpus_per_node=1)
    assert Contention.for_plan(one_per_node, across).links == (SharedLink("ib", ("dp_comm", "pp_comm")),)
    assert Contention.for_plan(cluster(world=across.world_size), across).links == ()  # all on NVLink
    assert Contention.for_plan(one_per_node, across, share_ib=False, pcie="fifo").links == (
        SharedLink("pcie", ("h2d", "d2h"), "fifo"),)
    lst = sim.simulate(MODEL, one_per_node, across)
    ev = sim.simulate(MODEL, one_per_node, across, engine="events")  # default contention: the shared NIC
    assert ev.contention.links and ev.step_time > lst.step_time
    assert ev.busy["dp_comm"][0] > lst.busy["dp_comm"][0]  # stretched by sharing


def test_bad_contention_is_named():
    with pytest.raises(ValueError, match="streams must be two or more"):
        SharedLink("x", ("dp_comm", "ib"))
    with pytest.raises(ValueError, match="policy"):
        SharedLink("x", ("dp_comm", "pp_comm"), "lifo")
    with pytest.raises(ValueError, match="one SharedLink only"):
        Contention((SharedLink("a", ("dp_comm", "pp_comm")), SharedLink("b", ("pp_comm", "h2d"))))
    with pytest.raises(ValueError, match="capacity"):
        MemoryCap(0)
    with pytest.raises(ValueError, match="categories"):
        MemoryCap(1.0, categories=("weights",))
