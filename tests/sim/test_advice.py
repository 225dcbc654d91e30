"""sim.planning.advice: the ZeRO / offload ladder's bytes are zero_ref.memory's, memory falls where each rung
adds partitioning or offload, and the recommendation is the first rung that fits."""
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.planning import advice
from sim.planning.bounds import memory_lower_bound
from zero_ref.memory import model_state_bytes, offload_placement

NAMES = [r.name for r in advice.RUNGS]


def test_rungs_hold_zero_refs_model_states():
    model, cluster = sim.Model.preset("gpt3-13b"), advice.cluster_of("A100-80GB", 8)
    steps = advice.ladder(model, cluster)
    psi = model.num_params
    for s in steps:
        assert s.gpu_bytes == memory_lower_bound(model, s.plan)["total"]
        r = s.rung
        if r.offload_optimizer == "none":
            states = model_state_bytes(psi, zero_stage=r.zero_stage, dp=8, precision="bf16").total
            assert s.cpu_bytes_per_node == s.nvme_bytes_per_node == 0
        else:
            tiers = offload_placement(psi, zero_stage=r.zero_stage, dp=8, precision="bf16",
                                      offload_optimizer=r.offload_optimizer, offload_param=r.offload_param)
            states = tiers["gpu"].total
            host = tiers["cpu"].total + tiers["nvme"].total
            assert s.cpu_bytes_per_node + s.nvme_bytes_per_node == pytest.approx(8 * host)
        assert memory_lower_bound(model, s.plan)["states"] == pytest.approx(states)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["gpt3-1.3b", "gpt3-13b", "llama-33b", "llama-65b", "gpt3-175b"]),
       gpus=st.sampled_from([1, 2, 4, 8, 16, 64]), gpu=st.sampled_from(["A100-40GB", "A100-80GB", "H100-80GB"]),
       mbs=st.sampled_from([1, 2, 4]), recompute=st.sampled_from(["none", "selective", "full"]))
def test_each_rung_saves_gpu_memory_on_what_it_partitions_or_offloads(name, gpus, gpu, mbs, recompute):
    steps = dict(zip(NAMES, advice.ladder(sim.Model.preset(name), advice.cluster_of(gpu, gpus),
                                           micro_batch_size=mbs, recompute=recompute)))
    gb = {k: s.gpu_bytes for k, s in steps.items()}
    z = [gb["DDP (ZeRO-0)"], gb["ZeRO-1"], gb["ZeRO-2"], gb["ZeRO-3"]]  # equal at one GPU
    assert z == sorted(z, reverse=True)
    assert gb["ZeRO-2"] > gb["ZeRO-2 + opt→CPU (Offload)"]
    assert gb["ZeRO-3"] > gb["ZeRO-3 + opt→CPU"] >= gb["ZeRO-3 + opt,params→CPU"]
    assert gb["ZeRO-3 + opt,params→CPU"] == gb["ZeRO-3 + opt,params→NVMe (Infinity)"]
    rec = next((s for s in steps.values() if s.fits), None)
    got = advice.recommend(sim.Model.preset(name), advice.cluster_of(gpu, gpus), micro_batch_size=mbs,
                           recompute=recompute)
    assert (got and got.rung) == (rec and rec.rung)


def test_the_four_limits_on_one_node():
    """On 8 × A100-80GB: 1.3B needs nothing, 13B ZeRO-1, 65B ZeRO-3 + CPU offload, 175B NVMe (host too small)."""
    cluster = advice.cluster_of("A100-80GB", 8)
    got = {name: advice.recommend(sim.Model.preset(name), cluster).rung.name
           for name in ("gpt3-1.3b", "gpt3-13b", "llama-33b", "llama-65b", "gpt3-175b")}
    assert got == {"gpt3-1.3b": "DDP (ZeRO-0)", "gpt3-13b": "ZeRO-1", "llama-33b": "ZeRO-2 + opt→CPU (Offload)",
                   "llama-65b": "ZeRO-3 + opt→CPU", "gpt3-175b": "ZeRO-3 + opt,params→NVMe (Infinity)"}
    steps = advice.ladder(sim.Model.preset("gpt3-175b"), cluster)
    assert not steps[6].fits_cpu and steps[6].fits_gpu  # the host is what runs out before NVMe


def test_nothing_fits_when_one_gpus_activations_do_not():
    model = sim.Model.preset("llama-65b")
    assert advice.recommend(model, advice.cluster_of("A100-80GB", 8), micro_batch_size=64, recompute="none") is None
    assert advice.recommend(model, advice.cluster_of("A100-80GB", 64), micro_batch_size=1, tp=8) is not None


def test_simulated_ladder_uses_the_simulated_peak():
    model, cluster = sim.Model.preset("gpt3-1.3b"), advice.cluster_of("A100-80GB", 8)
    for s in advice.ladder(model, cluster, simulate=True, num_microbatches=2):
        assert s.step_time > 0 and s.peak_bytes >= s.gpu_bytes * (1 - 1e-12)
    assert "DDP (ZeRO-0)" in advice.ladder_table(advice.ladder(model, cluster), cluster)


def test_bad_input():
    with pytest.raises(ValueError, match="12 GPUs: above 8 they must fill whole 8-GPU nodes"):
        advice.cluster_of("A100-80GB", 12)
    with pytest.raises(ValueError, match="gpus must be a positive integer"):
        advice.cluster_of("A100-80GB", 0)
    with pytest.raises(ValueError, match="do not split into tp 3"):
        advice.ladder(sim.Model.preset("gpt3-1.3b"), advice.cluster_of("A100-80GB", 8), tp=3)


def test_deepspeed_runs_no_zero_2_or_3_with_pipeline_parallelism():
    model, cluster = sim.Model.preset("llama-13b"), advice.cluster_of("A100-80GB", 64)
    steps = advice.ladder(model, cluster, tp=8, pp=4)
    assert [s.allowed for s in steps] == [s.rung.zero_stage <= 1 for s in steps]
    assert not any(s.fits for s in steps if s.rung.zero_stage >= 2)
    assert "no: DeepSpeed pp" in advice.ladder_table(steps, cluster)
    anything = advice.ladder(model, cluster, tp=8, pp=4, framework="any")
    assert all(s.allowed for s in anything)
    assert [s.gpu_bytes for s in anything] == [s.gpu_bytes for s in steps]
    assert all(s.allowed for s in advice.ladder(model, cluster, tp=8, pp=1))
    with pytest.raises(ValueError, match="framework"):
        advice.ladder(model, cluster, framework="megatron")
