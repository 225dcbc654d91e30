"""The simulated memory: static model states are zero_ref.memory's; the timeline adds what the tasks hold."""
import math

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.step.memory_timeline import static_bytes
from zero_ref.memory import GB, activation_bytes_per_layer, model_state_bytes, offload_placement

MODEL = sim.Model.preset("gpt3-1.3b")  # 24 layers


def run(plan, **kw):
    cluster = sim.Cluster.preset("A100-80GB", nodes=max(1, plan.world_size // 8),
                                 gpus_per_node=min(8, plan.world_size))
    return sim.simulate(MODEL, cluster, plan, **kw)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 8), (2, 2, 2), (4, 2, 1), (1, 4, 2)])
def test_static_model_states_equal_zero_ref(stage, tp, pp, dp):
    plan = sim.Plan(zero_stage=stage, tp=tp, pp=pp, dp=dp, num_microbatches=4)
    want = model_state_bytes(MODEL.num_params, zero_stage=stage, dp=dp, precision="bf16", tp=tp, pp=pp)
    r = run(plan)
    for s in range(pp):
        times, curves = r.memory.curve(s)
        assert times[0] == 0.0
        assert (curves["param"][0], curves["grad"][0], curves["optim"][0]) == (want.params, want.grads, want.optimizer)
        # model states never change during the step: transients have their own categories
        peak = r.peak_memory[s]
        assert (peak["param"], peak["grad"], peak["optim"]) == (want.params, want.grads, want.optimizer)


@pytest.mark.parametrize("opt,param", [("cpu", "none"), ("cpu", "cpu"), ("nvme", "nvme"), ("none", "cpu")])
def test_offloaded_states_equal_zero_ref_placement(opt, param):
    plan = sim.Plan(zero_stage=3, tp=2, pp=2, dp=2, num_microbatches=2, offload_optimizer=opt, offload_param=param)
    want = offload_placement(MODEL.num_params, zero_stage=3, dp=2, precision="bf16",
                             offload_optimizer=opt, offload_param=param)
    r = run(plan)
    for tier in ("gpu", "cpu", "nvme"):
        _, curves = r.memory.curve(0, tier)
        for ours, theirs in (("param", "params"), ("grad", "grads"), ("optim", "optimizer")):
            assert curves[ours][0] == pytest.approx(getattr(want[tier], theirs) / 4, rel=1e-12), (tier, ours)


def test_zero_paper_figure_1():
    """Ψ = 7.5B, N_d = 64, K = 12: 120 → 31.4 → 16.6 → 1.9 GB per device."""
    got = [round(sum(static_bytes(7_500_000_000, sim.Plan(zero_stage=z, dp=64, precision="fp16"))["gpu"].values())
                 / GB, 1) for z in range(4)]
    assert got == [120.0, 31.4, 16.6, 1.9]


def test_activations_are_korthikanti_per_layer_times_layers_per_stage():
    for recompute, sp in (("none", False), ("selective", True), ("full", False)):
        plan = sim.Plan(tp=2, pp=2, dp=2, micro_batch_size=2, num_microbatches=1, schedule="gpipe",
                        recompute=recompute, sequence_parallel=sp)
        r = run(plan, granularity="stage")
        per_layer = activation_bytes_per_layer(MODEL.seq, 2, MODEL.hidden, MODEL.heads, tp=2, sp=sp,
                                               recompute=recompute)
        times, curves = r.memory.curve(0)
        # after the first forward allocates and before any backward frees: one micro-batch of 12 layers
        assert curves["activation"][1] == 12 * per_layer
        if recompute != "none":  # backward re-materializes one layer's activations on top
            full = activation_bytes_per_layer(MODEL.seq, 2, MODEL.hidden, MODEL.heads, tp=2, sp=sp)
            extra = full - (per_layer if recompute == "selective" else 0)
            assert r.peak_memory[0]["activation"] == pytest.approx(12 * per_layer + extra)


def test_zero3_holds_gathered_layers_and_buckets_only_transiently(monkeypatch):
    layer_params = MODEL.num_params / MODEL.layers
    plan = sim.Plan(zero_stage=3, dp=8, num_microbatches=2, reduce_bucket_size=int(layer_params))
    r = run(plan, granularity="layer")
    peak = r.peak_memory[0]
    assert peak["zero3_gathered"] == pytest.approx(2 * 2 * layer_params)  # the layer in use + the prefetched one
    # the next layer's backward waits for its gather, which queues behind this bucket's reduce-scatter
    assert peak["comm_bucket"] == pytest.approx(2 * layer_params)
    monkeypatch.setattr(sim.step.lowering, "BACKWARD_GATHER", "prefetch")  # gathered ahead: the next grads overlap
    assert run(plan, granularity="layer").peak_memory[0]["comm_bucket"] == pytest.approx(2 * 2 * layer_params)
    _, curves = r.memory.curve(0)
    for name in ("zero3_gathered", "comm_bucket", "activation"):
        assert curves[name][-1] == pytest.approx(0, abs=1e-3)  # everything transient is freed by the step's end


@settings(max_examples=15, deadline=None)
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), dp=st.sampled_from([2, 4]),
       m=st.integers(1, 4), mbs=st.integers(1, 2), recompute=st.sampled_from(["none", "full"]),
       precision=st.sampled_from(["bf16", "fp16", "fp32", "bf16_fp32_grads"]),
       bucket_layers=st.sampled_from([1, 2]))
def test_memory_falls_from_stage_0_to_3(tp, pp, dp, m, mbs, recompute, precision, bucket_layers):
    """Model states fall strictly; the simulated peak falls too when a bucket holds a few layers."""
    bucket = int(bucket_layers * MODEL.num_params / MODEL.layers / tp)
    states, peaks = [], []
    for stage in range(4):
        plan = sim.Plan(zero_stage=stage, tp=tp, pp=pp, dp=dp, num_microbatches=m, micro_batch_size=mbs,
                        recompute=recompute, precision=precision, reduce_bucket_size=bucket)
        states.append(sum(static_bytes(MODEL, plan)["gpu"].values()))
        peaks.append(run(plan, granularity="layer").peak_gpu_bytes)
    assert states == sorted(states, reverse=True) and len(set(states)) == 4
    assert peaks == sorted(peaks, reverse=True)


def test_a_bucket_as_big_as_the_stage_makes_zero2_peak_above_zero1():
    """DeepSpeed's default 5e8-element bucket holds 10 of the 12 layers a pipeline stage of a 1.3B
    model has: ZeRO-2's transient bucket then outweighs the gradient partition it saves over dp = 2
    (visible in the total when recomputation keeps the activations small during backward)."""
    peaks = [run(sim.Plan(zero_stage=z, pp=2, dp=2, recompute="full"), granularity="layer").peak_memory[0]
             for z in (1, 2)]
    assert peaks[1]["grad"] < peaks[0]["grad"]
    layer = MODEL.num_params / MODEL.layers
    full = math.ceil(500_000_000 / layer)  # layers that fill the default bucket (10 of 24)
    # + the layers whose gradients arrive while it reduces: two behind DeepSpeed's all-reduce, one
    # behind the paper's reduce-scatter (zero_ref's), which takes half as long
    assert peaks[1]["comm_bucket"] == pytest.approx(2 * layer * (full + 2))
    paper = run(sim.Plan(zero_stage=2, pp=2, dp=2, recompute="full", framework="zero_ref"),
                granularity="layer").peak_memory[0]
    assert paper["comm_bucket"] == pytest.approx(2 * layer * (full + 1))
    assert peaks[1]["total"] > peaks[0]["total"]
