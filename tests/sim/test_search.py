"""sim.planning.search: the best plan is feasible and nothing enumerated beats it (brute force); the pruning
bounds never exceed what the simulator reports, so pruning never discards a plan that fits; the
search is deterministic and refuses impossible input with a clear message."""

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.calibration import calibrate
from sim.planning import search
from sim.planning.bounds import memory_lower_bound, time_lower_bound

MODEL = sim.Model.preset("gpt3-1.3b")  # 24 layers, 16 heads (the bounds' property test)
COSTS = calibrate.calibrate()
# The brute-force case: 6.7B does not fit on 8 × 40 GB without splitting something (16Ψ = 107 GB).
BIG, CLUSTER, BATCH = sim.Model.preset("gpt3-6.7b"), sim.Cluster.preset("A100-40GB", nodes=1), 8
SMALL = search.Space(micro_batch_sizes=(1, 2), recompute=("none", "full"), schedules=("1f1b", "interleaved"), virtual=(2,),
                     sequence_parallel=(True,),
                     offload=(("none", "none"), ("cpu", "none")))


@pytest.fixture(scope="module")
def truth():
    """Every enumerated plan simulated, no bounds: {name: (step time, peak bytes)}."""
    out = {}
    for plan in search.enumerate_plans(BIG, CLUSTER, BATCH, SMALL):
        r = sim.simulate(BIG, CLUSTER, plan, COSTS, granularity=search.granularity_for(BIG, plan))
        out[search.describe(plan)] = (r.step_time, r.peak_gpu_bytes)
    return out


@pytest.fixture(scope="module")
def exhaustive():
    return search.search(BIG, CLUSTER, BATCH, SMALL, COSTS, top=None)


def test_best_is_feasible_and_no_enumerated_plan_is_faster(truth):
    result = search.search(BIG, CLUSTER, BATCH, SMALL, COSTS, top=5)
    limit = result.memory_limit
    fitting = sorted((t, peak) for t, peak in truth.values() if peak <= limit)
    assert result.stats["enumerated"] == len(truth) > 200
    assert result.stats["pruned"] > 0 and result.stats["skipped"] > 0  # both prunings did something
    assert 0 < len(fitting) < len(truth)                               # some plans fit, some do not
    best = result.best
    assert best.fits and best.peak_bytes <= limit
    assert (best.step_time, best.peak_bytes) == truth[search.describe(best.plan)]
    assert best.step_time == fitting[0][0]                             # nothing enumerated is faster
    assert [r.step_time for r in result.feasible[:5]] == [t for t, _ in fitting[:5]]
    assert result.stats["simulated"] < len(truth) / 10                 # and it got there cheaply


def test_exhaustive_search_agrees_with_brute_force_plan_by_plan(truth, exhaustive):
    limit = exhaustive.memory_limit
    assert exhaustive.count("skipped") == 0
    assert sorted(search.describe(r.plan) for r in exhaustive.feasible) == sorted(
        name for name, (_, peak) in truth.items() if peak <= limit)
    for row in exhaustive.rows:
        t, peak = truth[search.describe(row.plan)]
        if row.status == "pruned":  # pruning discarded no plan that fits
            assert peak > limit, search.describe(row.plan)
        else:
            assert (row.step_time, row.peak_bytes) == (t, peak)


plans = st.builds(
    dict, tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 4]),
    zero=st.integers(0, 3), mbs=st.sampled_from([1, 2]), k=st.integers(1, 3),
    schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]), recompute=st.sampled_from(["none", "selective", "full"]),
    sp=st.booleans(), offload=st.sampled_from(["none", "cpu", "cpu+param", "nvme"]), overlap=st.booleans(),
    clip=st.sampled_from([0.0, 1.0]), precision=st.sampled_from(["bf16", "fp16", "fp32"]),
    bucket=st.sampled_from([500_000_000, 20_000_000]), fine=st.booleans(), calibrated=st.booleans(),
    cp=st.sampled_from([1, 2]), cp_kind=st.sampled_from(["ring", "ulysses"]))


@settings(max_examples=60, deadline=None)
@given(plans)
def test_bounds_never_exceed_the_simulation(x):
    """The pruning's safety: a lower bound above the limit implies the simulated peak is too."""
    opt = "none" if x["zero"] == 0 else "cpu" if x["offload"] != "none" and x["zero"] < 3 else x["offload"].split("+")[0]
    if x["zero"] < 3 and opt == "nvme":
        opt = "cpu"
    param = {"cpu+param": "cpu", "nvme": "nvme"}.get(x["offload"], "none") if x["zero"] == 3 else "none"
    v = 2 if x["schedule"] == "interleaved" else 1
    plan = sim.Plan(zero_stage=x["zero"], tp=x["tp"], pp=x["pp"], dp=x["dp"], micro_batch_size=x["mbs"],
                    num_microbatches=x["k"] * x["pp"], schedule=x["schedule"], virtual=v, recompute=x["recompute"],
                    sequence_parallel=x["sp"] and x["tp"] > 1, precision=x["precision"], offload_optimizer=opt,
                    offload_param=param, overlap_comm=x["overlap"], gradient_clipping=x["clip"],
                    reduce_bucket_size=x["bucket"], allgather_bucket_size=x["bucket"], cp=x["cp"], cp_kind=x["cp_kind"])
    world = plan.world_size
    cluster = sim.Cluster.preset("A100-80GB", nodes=max(1, world // 8), gpus_per_node=min(8, world))
    costs = COSTS if x["calibrated"] else sim.Costs()
    g = 1 if x["fine"] else search.granularity_for(MODEL, plan)
    r = sim.simulate(MODEL, cluster, plan, costs, granularity=g)
    t = time_lower_bound(MODEL, cluster, plan, costs, granularity=g)
    m = memory_lower_bound(MODEL, plan)
    assert t <= r.step_time * (1 + 1e-12), (t, r.step_time)
    assert m["total"] <= r.peak_gpu_bytes * (1 + 1e-12), (m, r.peak_memory)
    assert t >= 0.5 * r.step_time or plan.zero_stage == 3  # and not uselessly loose (ZeRO-3 can be)


def test_bounds_are_tight_on_megatron_plans():
    """On the compute-bound plans a search ends up ranking, the bounds sit within a few per cent."""
    model = sim.Model.preset("gpt3-175b")
    cluster = sim.Cluster.preset("A100-80GB", nodes=128)
    plan = sim.Plan(zero_stage=1, tp=8, pp=8, dp=16, num_microbatches=96, schedule="interleaved", virtual=3,
                    recompute="selective", sequence_parallel=True)
    g = search.granularity_for(model, plan)
    r = sim.simulate(model, cluster, plan, COSTS, granularity=g)
    assert 0.9 < time_lower_bound(model, cluster, plan, COSTS, granularity=g) / r.step_time <= 1
    assert 0.9 < memory_lower_bound(model, plan)["total"] / r.peak_gpu_bytes <= 1


def test_deterministic():
    a = search.search(BIG, CLUSTER, BATCH, SMALL, COSTS, top=3)
    b = search.search(BIG, CLUSTER, BATCH, SMALL, COSTS, top=3)
    key = lambda res: [(search.describe(r.plan), r.status, r.step_time, r.peak_bytes, r.reason) for r in res.rows]
    assert key(a) == key(b)
    assert a.table().splitlines()[1:] == b.table().splitlines()[1:]


def test_enumeration_respects_the_rules():
    cluster = sim.Cluster.preset("A100-80GB", nodes=2)
    model = sim.Model.preset("llama-13b")  # 40 layers, 40 heads
    for p in search.enumerate_plans(model, cluster, 64):
        assert model.heads % p.tp == 0 and p.tp <= 8 and model.layers % (p.pp * p.virtual) == 0
        assert p.world_size == 16 and p.global_batch == 64
        assert not (p.offload_param != "none" and p.zero_stage != 3)
    # by default only what DeepSpeed runs: ZeRO-2/3 without pipeline parallelism (PipelineEngine's assert)
    deepspeed = search.enumerate_plans(model, cluster, 64)
    assert {p.zero_stage for p in deepspeed if p.pp > 1} == {0, 1}
    assert {p.zero_stage for p in deepspeed if p.pp == 1} == {0, 1, 2, 3}
    anything = search.enumerate_plans(model, cluster, 64, search.Space(framework="any"))
    assert {p.zero_stage for p in anything if p.pp > 1} == {0, 1, 2, 3}
    assert set(deepspeed) < set(anything)
    assert search.enumerate_plans(model, cluster, 64, search.Space(max_zero_with_pp=1)) == deepspeed
    tps = {p.tp for p in deepspeed}
    assert tps == {1, 2, 4, 8} - {p for p in (1, 2, 4, 8) if 40 % p}
    # TP across nodes only when asked for by name
    assert {p.tp for p in search.enumerate_plans(model, sim.Cluster.preset("A100-80GB", nodes=4), 64,
                                                 search.Space(tp=(8, 16)))} == {8}  # 40 heads: not 16
    wide = sim.Model.preset("llama-2-7b")
    assert {p.tp for p in search.enumerate_plans(wide, sim.Cluster.preset("A100-80GB", nodes=4), 64,
                                                 search.Space(tp=(16,)))} == {16}
    # key/value groups must split too: Llama-3-8B has 8
    assert max(p.tp for p in search.enumerate_plans(sim.Model.preset("llama-3-8b"), cluster, 64,
                                                    search.Space(tp=(8, 16)))) == 8
    with pytest.raises(ValueError, match="framework"):
        search.Space(framework="fsdp")


def test_pareto_front_is_not_dominated_and_the_pareto_search_finds_all_of_it(exhaustive):
    front = exhaustive.pareto_front()
    assert len(front) > 2 and front[0].step_time == exhaustive.best.step_time
    for r in exhaustive.feasible:
        assert any(f.step_time <= r.step_time and f.peak_bytes <= r.peak_bytes for f in front)
    for a in front:
        assert not any(b.step_time < a.step_time and b.peak_bytes < a.peak_bytes for b in exhaustive.feasible)
    quick = search.search(BIG, CLUSTER, BATCH, SMALL, COSTS, top=1, pareto=True)
    name = lambda rows: [(search.describe(r.plan), r.step_time, r.peak_bytes) for r in rows]
    assert name(quick.pareto_front()) == name(front)
    assert quick.stats["simulated"] < exhaustive.stats["simulated"] / 2


def test_indivisible_global_batch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"global_batch 7 does not split .*dp can be"):
        search.search(MODEL, CLUSTER, 7, search.Space(micro_batch_sizes=(2, 4)))
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="global_batch must be a positive integer"):
            search.search(MODEL, CLUSTER, bad)
    with pytest.raises(ValueError, match="top must be"):
        search.search(MODEL, CLUSTER, 32, top=0)
    with pytest.raises(ValueError, match="memory_fraction"):
        search.search(MODEL, CLUSTER, 32, memory_fraction=1.5)


def test_no_plan_fits_names_the_smallest_memory_needed():
    model, cluster = sim.Model.preset("gpt3-175b"), sim.Cluster.preset("A100-40GB", nodes=1)
    space = search.Space(micro_batch_sizes=(1,), offload=(("none", "none"),))
    with pytest.raises(search.NoPlanFits, match=r"no plan fits in 36\.0 GiB.*smallest any of the \d+ plans needs") as e:
        search.search(model, cluster, 8, space)
    needs = [memory_lower_bound(model, p)["total"] for p in search.enumerate_plans(model, cluster, 8, space)]
    assert e.value.smallest == min(needs) > 0.9 * cluster.gpu.hbm_bytes
    assert isinstance(e.value, ValueError)


def test_long_sequences_get_context_parallelism():
    # Llama-3-8B at 32k tokens on 16 H100s: splitting the sequence beats every plan without cp
    model, cluster = sim.Model.preset("llama-3-8b", seq=32768), sim.Cluster.preset("H100-80GB", nodes=2)
    best = search.search(model, cluster, 32, search.Space(attention="flash"), COSTS, top=3).best
    without = search.search(model, cluster, 32, search.Space(attention="flash", cp=(1,)), COSTS, top=3).best
    assert best.plan.cp > 1 and best.plan.cp_kind == "ulysses"  # DeepSpeed ships Ulysses, not ring attention
    assert best.step_time < without.step_time
    assert f"cp{best.plan.cp}u" in search.describe(best.plan)
    ring = search.search(model, cluster, 32, search.Space(attention="flash", framework="any", cp_kinds=("ring",)),
                         COSTS, top=3).best
    assert ring.plan.cp > 1 and ring.plan.cp_kind == "ring" and ring.step_time < without.step_time


def test_cp_degrees_follow_the_model():
    space = search.Space(framework="any")
    model = sim.Model.preset("llama-3-8b", seq=8192)  # 32 heads, 8 key/value heads
    pairs = search.context_degrees(model, 2, 64, space)
    assert (1, "ring") in pairs and (4, "ulysses") in pairs and (8, "ulysses") not in pairs  # 8 / tp 2 kv heads
    assert (32, "ring") in pairs and (64, "ring") not in pairs                               # 64 ∤ world / tp
    assert search.context_degrees(sim.Model.preset("llama-3-8b", seq=4096), 2, 64, space) == [(1, "ring")]
    assert all(p.world_size == 64 for p in search.enumerate_plans(model, sim.Cluster.preset("H100-80GB", nodes=8),
                                                                  512, space))
    with pytest.raises(ValueError, match="cp_kinds"):
        search.Space(cp_kinds=("stripes",))
fsdp_plans = st.builds(
    dict, tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), dp=st.sampled_from([2, 4, 8]),
    shard=st.sampled_from([0, 2]), reshard=st.booleans(), reduce=st.sampled_from(["fp32", "bf16"]),
    k=st.integers(1, 3), recompute=st.sampled_from(["none", "full"]), fine=st.booleans(),
    framework=st.sampled_from(["fsdp2", "megatron", "deepspeed"]), zero=st.integers(0, 3))


@settings(max_examples=40, deadline=None)
@given(fsdp_plans)
def test_bounds_never_exceed_the_simulation_for_each_framework(x):
    """The bounds hold for Megatron's and FSDP2's collectives (HSDP included) as for DeepSpeed's."""
    fw = x["framework"]
    zero = {"fsdp2": 3, "megatron": min(x["zero"], 1)}.get(fw, x["zero"])
    extra = dict(dp_shard=x["shard"] if x["shard"] < x["dp"] else 0, reshard_after_forward=x["reshard"],
                 reduce_dtype=x["reduce"]) if fw == "fsdp2" else {}
    if fw == "megatron" and zero == 1:
        extra = {"overlap_param_gather": x["reshard"]}
    plan = sim.Plan(zero_stage=zero, tp=x["tp"], pp=x["pp"], dp=x["dp"], num_microbatches=x["k"] * x["pp"],
                    recompute=x["recompute"], framework=fw, **extra)
    world = plan.world_size
    cluster = sim.Cluster.preset("H100-80GB", nodes=max(1, world // 8), gpus_per_node=min(8, world))
    g = 1 if x["fine"] else search.granularity_for(MODEL, plan)
    r = sim.simulate(MODEL, cluster, plan, granularity=g)
    t = time_lower_bound(MODEL, cluster, plan, granularity=g)
    assert t <= r.step_time * (1 + 1e-12), (t, r.step_time)
    assert memory_lower_bound(MODEL, plan)["total"] <= r.peak_gpu_bytes * (1 + 1e-12)


def test_each_framework_enumerates_what_it_runs():
    cluster = sim.Cluster.preset("A100-80GB", nodes=2)
    model = sim.Model.preset("llama-13b")
    megatron = search.enumerate_plans(model, cluster, 64, search.Space(framework="megatron"))
    assert {p.zero_stage for p in megatron} == {0, 1} and {p.framework for p in megatron} == {"megatron"}
    assert {p.schedule for p in megatron if p.pp > 1} == {"1f1b", "interleaved"}
    # DeepSpeed 0.19.8's PipelineEngine._train_schedule builds TrainSchedule (1F1B) and nothing else
    deepspeed = search.enumerate_plans(model, cluster, 64, search.Space())
    assert {p.schedule for p in deepspeed if p.pp > 1} == {"1f1b"} and max(p.zero_stage for p in deepspeed if p.pp > 1) == 1
    assert {(p.offload_optimizer, p.offload_param) for p in megatron} == {("none", "none")}
    fsdp = search.enumerate_plans(model, cluster, 64, search.Space(framework="fsdp2"))
    assert {p.zero_stage for p in fsdp} == {3} and {p.framework for p in fsdp} == {"fsdp2"}
    assert {p.reshard_after_forward for p in fsdp} == {True, False} and max(p.pp for p in fsdp) > 1
    assert {p.framework for p in search.enumerate_plans(model, cluster, 64, search.Space(framework="any"))} == {
        "deepspeed"}
