"""sim.spec (model, hardware, plan): presets, HF and DeepSpeed readers, preconditions that name the bad field."""
import pytest

import sim
from sim.spec.hardware import GPUS, NODES
from sim.spec.model import MODELS


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


# DeepSpeed configs over the stages and offload tiers, some leaving every ZeRO knob to its default
ONE_READER_CONFIGS = [
    {"train_batch_size": 8},
    {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}},
    {"train_batch_size": 16, "fp16": {"enabled": True},
     "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    {"train_batch_size": 32, "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 3}},
    {"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                                  "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}},
    {"train_batch_size": 8, "gradient_clipping": 0.5,
     "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e8, "allgather_bucket_size": 3e8}},
]


@pytest.mark.parametrize("config", ONE_READER_CONFIGS)
def test_from_deepspeed_takes_every_value_from_zero_ref_config(config, monkeypatch):
    """One reader: what zero_ref.config.parse returns is what the plan holds, defaults included."""
    from dataclasses import replace
    from zero_ref import config as ds_config
    real_parse = ds_config.parse

    def parse(*args, **kwargs):  # the real reading, with values no DeepSpeed default has
        cfg = real_parse(*args, **kwargs)
        zero = replace(cfg.zero_optimization, reduce_bucket_size=1234, allgather_bucket_size=5678,
                       overlap_comm=not cfg.zero_optimization.overlap_comm)
        return replace(cfg, zero_optimization=zero, gradient_clipping=0.25)

    monkeypatch.setattr(ds_config, "parse", parse)
    plan = sim.Plan.from_deepspeed(config, world_size=8)
    cfg = parse(config, dp=8)
    z = cfg.zero_optimization
    assert (plan.reduce_bucket_size, plan.allgather_bucket_size, plan.overlap_comm, plan.gradient_clipping) == (
        1234, 5678, z.overlap_comm, 0.25)
    assert (plan.zero_stage, plan.precision, plan.micro_batch_size, plan.num_microbatches, plan.dp) == (
        z.stage, cfg.precision, cfg.batch.train_micro_batch_size_per_gpu, cfg.batch.gradient_accumulation_steps, 8)
    assert (plan.offload_optimizer, plan.offload_param) == (
        (z.offload_optimizer or ds_config.OffloadOptimizerConfig()).device,
        (z.offload_param or ds_config.OffloadParamConfig()).device)


@pytest.mark.parametrize("zero,expect", [
    ({"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/a"}, "offload_optimizer": {"device": "cpu"}},
     dict(offload_param="nvme", offload_optimizer="cpu")),              # zero_ref keeps one NVMe store; DeepSpeed two
    ({"stage": 3, "offload_optimizer": {"device": "nvme"}}, dict(offload_optimizer="nvme")),  # the path: only at run time
    ({"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, dict(offload_optimizer="cpu")),
    ({"stage": 3, "zero_quantized_weights": True, "zero_hpz_partition_size": 8}, dict(zero_stage=3)),
    ({"stage": 2, "contiguous_gradients": False, "round_robin_gradients": True}, dict(zero_stage=2)),
    ({"stage": 2, "cpu_offload": True}, dict(offload_optimizer="cpu")),  # DeepSpeed's deprecated spelling
    ({"stage": 2, "overlap_comm": "auto"}, dict(overlap_comm=False)),   # the HF Trainer's placeholder: the default
])
def test_from_deepspeed_plans_what_deepspeed_accepts(zero, expect):
    """A planner reads any config DeepSpeed accepts, also where zero_ref could not run it."""
    config = {"train_batch_size": 8, "zero_optimization": zero, "bfloat16": {"enabled": True},
              "optimizer": {"type": "Lamb", "params": {"lr": 1e-3, "max_coeff": 10.0}},
              "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}},
              "tensorboard": {"enabled": True}, "communication_data_type": "fp32"}
    plan = sim.Plan.from_deepspeed(config, world_size=8)
    assert plan.precision == "bf16"  # "bfloat16" is DeepSpeed's other name for the section
    assert {k: getattr(plan, k) for k in expect} == expect


@pytest.mark.parametrize("cfg,match", [
    ({"train_batch_size": 8, "zero_optimization": {"overlap_com": True}}, r"^zero_optimization\.overlap_com .*overlap_comm"),
    ({"train_batch_size": 8, "gradient_clipping": -1}, r"^gradient_clipping must be >= 0"),
    ({"train_batch_size": 8, "zero_optimization": {"allgather_bucket_size": 0}}, r"^zero_optimization\.allgather_bucket_size"),
    ({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 0}}, r"^zero_optimization\.reduce_bucket_size"),
    ({"train_batch_size": 8, "amp": {"enabled": True}}, r"^amp was removed"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2}, "pipeline": {"stages": 2}}, r"^zero_optimization\.stage"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}},
     r"^zero_optimization\.offload_optimizer\.ratio.*stage 3"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 3, "compute_grad_norm": False}},
     r"^zero_optimization\.compute_grad_norm"),
    ({"train_batch_size": "auto"}, r"^train_batch_size"),
])
def test_from_deepspeed_refuses_what_deepspeed_refuses_naming_the_key(cfg, match):
    with pytest.raises(ValueError, match=match):
        sim.Plan.from_deepspeed(cfg, world_size=8)
