"""sim.config and sim.plan: presets, HF and DeepSpeed readers, preconditions that name the bad field."""
import pytest

import sim
from sim.config import GPUS, MODELS, NODES


def test_model_presets_have_the_published_sizes():
    assert MODELS["gpt3-175b"].num_params == pytest.approx(175e9, rel=0.005)
    gpt3 = MODELS["gpt3-175b"]
    assert (gpt3.layers, gpt3.hidden, gpt3.heads, gpt3.seq) == (96, 12288, 96, 2048)
    assert MODELS["gpt2-1.5b"].num_params == pytest.approx(1.5e9, rel=0.05)
    assert MODELS["llama-65b"].num_params == 65_285_660_672  # zero_ref.memory's doctest value
    for name, size in (("llama-7b", 6.74e9), ("llama-13b", 13.0e9), ("llama-33b", 32.5e9)):
        assert MODELS[name].num_params == pytest.approx(size, rel=0.01), name
    assert sim.Model.preset("gpt3-175b", seq=4096).seq == 4096


def test_gpu_presets_and_overrides():
    assert {n: g.peak_flops for n, g in GPUS.items()} == {
        "V100-32GB": 125e12, "A100-40GB": 312e12, "A100-80GB": 312e12, "H100-80GB": 989e12, "H200-141GB": 989e12}
    assert set(NODES) == set(GPUS)
    c = sim.Cluster.preset("H100-80GB", nodes=4, ib_bw=800e9, peak_flops=1e15)
    assert (c.world_size, c.ib_bw, c.gpu.peak_flops, c.nvlink_bw) == (32, 800e9, 1e15, 450e9)
    assert c.ib_bw_per_gpu == 100e9
    with pytest.raises(ValueError, match="unknown cluster preset"):
        sim.Cluster.preset("TPU")


def test_from_hf_config_matches_the_presets():
    llama = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
             "vocab_size": 32000, "max_position_embeddings": 2048, "intermediate_size": 11008,
             "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
    assert sim.Model.from_hf_config(llama).num_params == MODELS["llama-7b"].num_params
    gpt2 = {"model_type": "gpt2", "n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50257,
            "n_positions": 1024, "activation_function": "gelu_new"}
    assert sim.Model.from_hf_config(gpt2).num_params == MODELS["gpt2-1.5b"].num_params
    with pytest.raises(ValueError, match="num_hidden_layers"):
        sim.Model.from_hf_config({"hidden_size": 8})


@pytest.mark.parametrize("kwargs,field", [
    (dict(layers=0), "Model.layers"), (dict(hidden=100, heads=3), "Model.hidden"),
    (dict(norm="batchnorm"), "Model.norm"), (dict(seq=1.5), "Model.seq")])
def test_model_preconditions_name_the_field(kwargs, field):
    base = dict(name="m", layers=2, hidden=64, heads=4, vocab=100, seq=16)
    with pytest.raises(ValueError, match=field):
        sim.Model(**{**base, **kwargs})


@pytest.mark.parametrize("kwargs,field", [
    (dict(zero_stage=4), "Plan.zero_stage"), (dict(tp=0), "Plan.tp"), (dict(schedule="zb"), "Plan.schedule"),
    (dict(virtual=2), "Plan.virtual"), (dict(schedule="interleaved", pp=4, num_microbatches=6), "num_microbatches"),
    (dict(offload_optimizer="cpu"), "Plan.offload_optimizer"), (dict(offload_param="cpu", zero_stage=2), "offload_param"),
    (dict(zero_stage=2, offload_optimizer="nvme"), "offload_optimizer"), (dict(recompute="some"), "Plan.recompute"),
    (dict(sequence_parallel=True), "sequence_parallel"), (dict(precision="fp8"), "Plan.precision")])
def test_plan_preconditions_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        sim.Plan(**kwargs)


def test_plan_from_deepspeed_resolves_batches_like_deepspeed():
    cfg = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}, "gradient_clipping": 1.0}
    plan = sim.Plan.from_deepspeed(cfg, world_size=1024, tp=8, pp=16, recompute="full")
    assert (plan.dp, plan.num_microbatches, plan.micro_batch_size, plan.global_batch) == (8, 64, 1, 512)
    assert (plan.precision, plan.zero_stage, plan.reduce_bucket_size, plan.recompute) == ("bf16", 1, 500_000_000, "full")
    assert plan.overlap_comm is False  # DeepSpeed's default below stage 3
    z3 = sim.Plan.from_deepspeed({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                                  "fp16": {"enabled": True},
                                  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"},
                                                        "offload_param": {"device": "cpu"}}}, world_size=8)
    assert (z3.dp, z3.global_batch, z3.precision, z3.offload_optimizer, z3.offload_param, z3.overlap_comm) == (
        8, 64, "fp16", "nvme", "cpu", True)


@pytest.mark.parametrize("cfg,kw,match", [
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1}, {},
     "train_batch_size 10"),
    ({"gradient_accumulation_steps": 2}, {}, "train_micro_batch_size_per_gpu"),
    ({"train_batch_size": 8}, dict(tp=3), "not divisible"),
    ({"train_batch_size": 8, "bf16": {"enabled": True}, "fp16": {"enabled": True}}, {}, "both"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 5}}, {}, "zero_optimization.stage"),
    ({"train_batch_size": 8, "zero_optimization": {"offload_optimizer": {"device": "disk"}}}, {},
     "offload_optimizer.device"),
    ({"train_batch_size": 8, "zero_optimization": {"overlap_comm": "yes"}}, {}, "overlap_comm"),
    ({"train_batch_size": 8}, dict(schedul="gpipe"), "unknown Plan field"),
])
def test_plan_from_deepspeed_errors_name_the_key(cfg, kw, match):
    with pytest.raises(ValueError, match=match):
        sim.Plan.from_deepspeed(cfg, world_size=8, **kw)


def test_simulate_checks_the_combination():
    model, cluster = sim.Model.preset("gpt3-125m"), sim.Cluster.preset("A100-80GB")
    with pytest.raises(ValueError, match="the cluster has 8 GPUs"):
        sim.simulate(model, cluster, sim.Plan(dp=4))
    with pytest.raises(ValueError, match="Model.layers 12 must be at least"):
        sim.simulate(model, sim.Cluster.preset("A100-80GB", nodes=2), sim.Plan(pp=16))
    with pytest.raises(ValueError, match="no bf16"):
        sim.simulate(model, sim.Cluster.preset("V100-32GB"), sim.Plan(dp=8))
    with pytest.raises(TypeError, match="sim.Model"):
        sim.simulate("gpt3-125m", cluster, sim.Plan(dp=8))


def test_from_deepspeed_takes_deepspeeds_code_default_for_clipping():
    """DeepSpeed 0.19.8 clips at 1.0 when the config is silent (zero_ref.config agrees); 0 turns it off."""
    from zero_ref import config as ds_config
    base = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1}
    assert sim.Plan.from_deepspeed(base, 8).gradient_clipping == ds_config.parse(base).gradient_clipping == 1.0
    assert sim.Plan.from_deepspeed({**base, "gradient_clipping": 0}, 8).gradient_clipping == 0
