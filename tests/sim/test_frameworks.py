"""Whose collectives: each framework's stages send the bytes of its closed form, and the steps order sensibly."""
import pytest

import sim
from sim.step.lowering import build_graph
from sim.step.traffic import bytes_sent
from zero_ref.volume import dp_bytes_per_step

MODEL = sim.Model.preset("gpt3-1.3b")
NODE = sim.Cluster.preset("H100-80GB", nodes=1)
TWO_NODES = sim.Cluster.preset("H100-80GB", nodes=2)
PSI = MODEL.num_params

CASES = [  # (framework, stage, extra Plan fields)
    ("deepspeed", 0, {}), ("deepspeed", 1, {}), ("deepspeed", 2, {}), ("deepspeed", 3, {}),
    ("megatron", 0, {}), ("megatron", 1, {}), ("zero_ref", 1, {}), ("zero_ref", 2, {}),
    ("fsdp2", 3, {}), ("fsdp2", 3, {"reshard_after_forward": False}), ("fsdp2", 3, {"reduce_dtype": "bf16"}),
    ("fsdp2", 3, {"dp_shard": 4}), ("fsdp2", 3, {"dp_shard": 2, "reshard_after_forward": False}),
]


def sent(plan) -> float:
    return sum(bytes_sent(build_graph(MODEL, plan), plan).values())


def closed_form(framework, stage, m, dp, **kw) -> float:
    grad = 4 if framework == "fsdp2" and kw.get("reduce_dtype", "fp32") == "fp32" else 2
    fw = "paper" if framework == "zero_ref" else framework
    return dp_bytes_per_step(PSI, zero_stage=stage, dp=dp, framework=fw, micro_steps=m, param_bytes=2,
                             grad_bytes=grad, reshard_after_forward=kw.get("reshard_after_forward", True),
                             dp_shard=kw.get("dp_shard", 0))


@pytest.mark.parametrize("framework, stage, kw", CASES)
@pytest.mark.parametrize("m", [1, 3])
def test_bytes_each_rank_sends_per_step_equal_the_closed_form(framework, stage, kw, m):
    plan = sim.Plan(zero_stage=stage, dp=8, framework=framework, num_microbatches=m, **kw)
    if framework == "zero_ref" and stage == 2:  # the paper's count is one micro-step: reduce-scatter every one
        expected = (m + 1) * 7 / 8 * PSI * 2
    else:
        expected = closed_form(framework, stage, m, 8, **kw)
    assert sent(plan) == pytest.approx(expected, rel=1e-9)


def test_deepspeed_stages_1_and_2_send_three_halves_of_the_papers_volume():
    f = 7 / 8
    for stage in (1, 2):
        ds = sent(sim.Plan(zero_stage=stage, dp=8))
        assert ds == pytest.approx(3 * PSI * f * 2, rel=1e-9)              # 3Ψ(n−1)/n in bf16
        assert ds == pytest.approx(1.5 * sent(sim.Plan(zero_stage=stage, dp=8, framework="zero_ref")), rel=1e-9)
    assert sent(sim.Plan(zero_stage=1, dp=8, framework="megatron")) == pytest.approx(2 * PSI * f * 2, rel=1e-9)
    # stage 3: two all-gathers and a reduce-scatter, 3Ψ(n−1)/n, in DeepSpeed and in FSDP2 with bf16 reduce
    assert sent(sim.Plan(zero_stage=3, dp=8)) == pytest.approx(3 * PSI * f * 2, rel=1e-9)
    assert sent(sim.Plan(zero_stage=3, dp=8, framework="fsdp2", reduce_dtype="bf16")) == pytest.approx(
        3 * PSI * f * 2, rel=1e-9)


def test_each_framework_issues_its_own_collectives():
    def ops(plan):
        g = build_graph(MODEL, plan)
        return {(g.works[w].op, g.works[w].axis) for w in g.work if hasattr(g.works[w], "axis")
                and g.works[w].axis.startswith("dp")}
    assert ops(sim.Plan(zero_stage=1, dp=8)) == {("all_reduce", "dp"), ("all_gather", "dp")}
    assert ops(sim.Plan(zero_stage=1, dp=8, framework="megatron")) == {("reduce_scatter", "dp"), ("all_gather", "dp")}
    assert ops(sim.Plan(zero_stage=3, dp=8, framework="fsdp2", dp_shard=4)) == {
        ("all_gather", "dp_shard"), ("reduce_scatter", "dp_shard"), ("all_reduce", "dp_replica")}
    # without reshard_after_forward the backward gathers nothing
    g = build_graph(MODEL, sim.Plan(zero_stage=3, dp=8, framework="fsdp2", reshard_after_forward=False))
    gathers = [i for i in range(len(g)) if sim.step.graph.KINDS[g.kind[i]] == "zero3_gather"]
    assert len(gathers) == MODEL.layers


def test_step_times_order_sensibly():
    def t(cluster=TWO_NODES, **kw):
        return sim.simulate(MODEL, cluster, sim.Plan(dp=cluster.world_size, num_microbatches=2, **kw)).step_time
    # the same compute: the plan that sends less across the nodes finishes first
    assert t(zero_stage=1, framework="megatron") < t(zero_stage=1) <= t(zero_stage=2)  # 2: hidden in the next backward
    assert t(zero_stage=3, framework="fsdp2", reshard_after_forward=False) < t(zero_stage=3, framework="fsdp2")
    assert t(zero_stage=3, framework="fsdp2", reduce_dtype="bf16") < t(zero_stage=3, framework="fsdp2")
    # inside one node the gathers hide behind the compute: reshard or not, the same step
    assert t(NODE, zero_stage=3, framework="fsdp2", reshard_after_forward=False) == pytest.approx(
        t(NODE, zero_stage=3, framework="fsdp2"), rel=1e-6)
    # FSDP2 prefetches the backward's gathers; DeepSpeed's wait behind the reduce-scatters (lowering docstring)
    assert t(zero_stage=3, framework="fsdp2") < t(zero_stage=3)


def test_hsdp_gathers_inside_a_node_and_reduces_in_two_levels():
    hsdp = sim.Plan(zero_stage=3, dp=16, framework="fsdp2", dp_shard=8)
    cm = sim.CostModel(TWO_NODES, hsdp)
    assert (cm.links["dp_shard"].kind, cm.links["dp_shard"].size) == ("nvlink", 8)
    assert (cm.links["dp_replica"].kind, cm.links["dp_replica"].size) == ("ib", 2)
    by_kind = bytes_sent(build_graph(MODEL, hsdp), hsdp)
    # reduce-scatter (7/8 of Ψ fp32 within the node) + all-reduce of the 1/8 shard over 2 replicas
    assert by_kind["grad_reduce"] == pytest.approx(PSI * 4 * (7 / 8 + 2 * 1 / 2 / 8), rel=1e-9)
    assert by_kind["zero3_gather"] == pytest.approx(2 * PSI * 2 * 7 / 8, rel=1e-9)


def test_memory_follows_the_framework():
    def peak(cluster=NODE, **kw):
        return sim.simulate(MODEL, cluster, sim.Plan(dp=cluster.world_size, **kw)).peak_gpu_bytes
    fsdp = peak(zero_stage=3, framework="fsdp2")
    assert peak(zero_stage=3, framework="fsdp2", reshard_after_forward=False) > fsdp  # gathered units kept
    # HSDP holds the sharded states over dp_shard ranks: (16 − 16/4)·Ψ/… more than sharding over 16
    static = sim.step.memory_timeline.static_bytes
    flat = static(MODEL, sim.Plan(zero_stage=3, dp=16, framework="fsdp2"))["gpu"]
    hsdp = static(MODEL, sim.Plan(zero_stage=3, dp=16, framework="fsdp2", dp_shard=4))["gpu"]
    assert sum(hsdp.values()) == pytest.approx(4 * sum(flat.values()), rel=1e-9)
    assert peak(zero_stage=1, framework="megatron") == peak(zero_stage=1)  # the same ZeRO-1 states


@pytest.mark.parametrize("kw, field", [
    ({"framework": "torch"}, "Plan.framework"),
    ({"framework": "megatron", "zero_stage": 2}, "Plan.zero_stage"),
    ({"framework": "fsdp2", "zero_stage": 1}, "Plan.zero_stage"),
    ({"zero_stage": 3, "dp_shard": 2, "dp": 4}, "Plan.dp_shard"),
    ({"zero_stage": 3, "reshard_after_forward": False}, "Plan.reshard_after_forward"),
    ({"framework": "fsdp2", "zero_stage": 3, "dp": 8, "dp_shard": 3}, "Plan.dp_shard"),
    ({"framework": "fsdp2", "zero_stage": 3, "dp": 8, "dp_shard": 8}, "Plan.dp_shard"),
    ({"framework": "fsdp2", "zero_stage": 3, "reduce_dtype": "fp8"}, "Plan.reduce_dtype"),
    ({"framework": "fsdp2", "zero_stage": 3, "offload_optimizer": "cpu"}, "Plan.offload_optimizer"),
])
def test_bad_framework_fields_are_named(kw, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        sim.Plan(**kw)


def test_only_deepspeed_plans_have_a_deepspeed_config():
    with pytest.raises(ValueError, match="only a DeepSpeed .or zero_ref. plan has a DeepSpeed config"):
        sim.Plan(zero_stage=3, dp=8, framework="fsdp2").to_deepspeed()
    with pytest.raises(ValueError, match="from_deepspeed makes DeepSpeed plans"):
        sim.Plan.from_deepspeed({"train_batch_size": 8, "zero_optimization": {"stage": 1}}, 8, framework="megatron")
    plan = sim.Plan(zero_stage=1, dp=8, micro_batch_size=1)
    assert sim.Plan.from_deepspeed(plan.to_deepspeed(), 8) == plan


def test_megatrons_overlapped_param_gather_runs_in_the_next_forward():
    def run(**kw):
        plan = sim.Plan(zero_stage=1, dp=16, framework="megatron", num_microbatches=4, **kw)
        return plan, sim.simulate(MODEL, TWO_NODES, plan)
    plan, synced = run()
    overlapped_plan, overlapped = run(overlap_param_gather=True)
    assert sent(plan) == sent(overlapped_plan) == pytest.approx(2 * PSI * 15 / 16 * 2, rel=1e-9)
    gathers = [e for e in overlapped.events if e.kind == "param_gather" and e.stage == 0]
    forwards = [e for e in overlapped.events if e.kind == "forward" and e.stage == 0][:len(gathers)]
    assert gathers[0].start == 0.0 and len(gathers) == MODEL.layers
    assert all(f.start >= g.end for g, f in zip(gathers, forwards))   # each layer waits for its own
    last = max(e.end for e in synced.events if e.kind == "optimizer")
    assert max(e.end for e in synced.events if e.kind == "param_gather") > last  # else it ends the step
    assert overlapped.step_time < synced.step_time
    with pytest.raises(ValueError, match=r"Plan\.overlap_param_gather"):
        sim.Plan(zero_stage=1, dp=8, overlap_param_gather=True)


def test_the_local_fit_books_zero_refs_collectives_for_its_steps():
    """sim.calibration.fit_local times zero_ref's steps: the paper's reduce-scatter, whatever the plan's default."""
    from sim.calibration.fit_local import work_totals
    small = sim.Model("tiny", layers=2, hidden=64, heads=2, vocab=128, seq=16)
    ops = {op for op, _, axis in work_totals(small, sim.Plan(zero_stage=1, dp=2, gradient_clipping=0.0))["collectives"]}
    assert ops == {"reduce_scatter", "all_gather"}


def test_hsdp_groups_and_a_trace_of_them():
    from sim.spec.topology import group_ranks
    assert group_ranks("dp_shard", 2, 8, 1, d=5, shard=4) == [8, 10, 12, 14]   # dp ranks 4–7 of t = 0
    assert group_ranks("dp_replica", 2, 8, 1, d=5, shard=4) == [2, 10]         # dp ranks 1 and 5
    r = sim.simulate(MODEL, TWO_NODES, sim.Plan(zero_stage=3, dp=16, framework="fsdp2", dp_shard=8))
    groups = {e["args"]["Process Group Name"]: e["args"]["Group size"]
              for e in sim.chrome_trace(r)["traceEvents"] if "Process Group Name" in e.get("args", {})}
    assert groups == {"dp_shard": 8, "dp_replica": 2, "world": 16}  # world: the gradient norm


@pytest.mark.parametrize("framework, stage, kw", [("deepspeed", 1, {}), ("deepspeed", 3, {}), ("megatron", 1, {}),
                                                  ("fsdp2", 3, {}), ("fsdp2", 3, {"dp_shard": 2})])
def test_context_parallel_ranks_join_the_data_parallel_collectives(framework, stage, kw):
    """dp 4 × cp 2: the gradients are reduced and the states sharded over the 8 ranks holding the same
    parameters (DeepSpeed's seq_data_parallel_group, torchtitan's dp_shard_cp), as dp 8 does."""
    model = sim.Model.preset("llama-3-8b", seq=8192)
    plan = sim.Plan(zero_stage=stage, dp=4, cp=2, cp_kind="ring", framework=framework, attention="flash", **kw)
    assert plan.shard_group == 2 * (kw.get("dp_shard") or 4)
    expected = dp_bytes_per_step(model.num_params, zero_stage=stage, dp=8, micro_steps=1,
                                 framework="paper" if framework == "zero_ref" else framework,
                                 grad_bytes=4 if framework == "fsdp2" else 2,
                                 dp_shard=2 * kw["dp_shard"] if "dp_shard" in kw else 0)
    assert sum(bytes_sent(build_graph(model, plan), plan).values()) == pytest.approx(expected, rel=1e-9)
    states = sim.step.memory_timeline.static_bytes(model, plan)["gpu"]
    eight = sim.step.memory_timeline.static_bytes(model, sim.Plan(zero_stage=stage, dp=8, framework=framework,
                                                                  **({"dp_shard": 4} if "dp_shard" in kw else {})))
    assert states == pytest.approx(eight["gpu"], rel=1e-12)
    r = sim.simulate(model, TWO_NODES, sim.Plan(**{**plan.__dict__, "dp": 8}), granularity="stage")
    assert r.step_time > 0 and r.plan.world_size == 16
