"""LLaMA-style models in the simulator: GQA, SwiGLU, RMSNorm, no dropout, FlashAttention plans."""
import json

import pytest

import sim
from sim.cost.flops import attention_core_flops, layer_backward_flops, layer_forward_flops
from zero_ref.memory import activation_terms

# HF's parameter counts (sum of numel over the checkpoint's tensors) for the published configs
HF_COUNTS = {"llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320, "llama-2-70b": 68_976_648_192,
             "llama-3-8b": 8_030_261_248, "llama-3-70b": 70_553_706_496}
LLAMA_3_8B_CONFIG = {  # meta-llama/Meta-Llama-3-8B config.json (the keys the reader uses)
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256}


@pytest.mark.parametrize("name", sorted(HF_COUNTS))
def test_presets_have_hf_parameter_counts(name):
    assert sim.Model.preset(name).num_params == HF_COUNTS[name]


def test_from_hf_config_reads_gqa_from_a_dict_or_a_path(tmp_path):
    m = sim.Model.from_hf_config(LLAMA_3_8B_CONFIG)
    assert (m.kv_heads, m.ffn_hidden, m.gated, m.norm, m.tied, m.dropout, m.vocab) == (8, 14336, True, "rmsnorm",
                                                                                       False, False, 128256)
    assert m.num_params == HF_COUNTS["llama-3-8b"]
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B_CONFIG))
    assert sim.Model.from_hf_config(tmp_path).num_params == sim.Model.from_hf_config(tmp_path / "config.json").num_params
    with pytest.raises(ValueError, match="no HF config"):
        sim.Model.from_hf_config(tmp_path / "missing")


def test_gqa_flops_and_activations():
    mha = sim.Model.preset("llama-3-8b", kv_heads=None)
    gqa = sim.Model.preset("llama-3-8b")
    b, s, h = 1, gqa.seq, gqa.hidden
    # k and v project to 8 × 128 = 1024 instead of 4096: 2 · 2bs·h·(h − 1024) fewer FLOPs per layer
    assert layer_forward_flops(mha, b) - layer_forward_flops(gqa, b) == 2 * 2 * b * s * h * (h - 1024)
    assert mha.num_params - gqa.num_params == 32 * 2 * h * (h - 1024)
    flash = gqa.activation_terms(b, attention="flash")
    assert flash.terms["K, V"] == 2 * 2 * s * b * 1024
    assert flash.total == activation_terms(s, b, h, 32, kv_heads=8, ffn=14336, mlp="swiglu", norm="rmsnorm",
                                           attention="flash", dropout=False, stat_bytes=0).total


def test_tp_must_split_whole_key_value_groups():
    model = sim.Model.preset("llama-3-8b")
    with pytest.raises(ValueError, match="kv_heads 8 must be divisible by Plan.tp 16"):
        model.check_tp(16)
    cluster = sim.Cluster.preset("H100-80GB", nodes=2)
    with pytest.raises(ValueError, match="Plan.tp 16"):
        sim.simulate(model, cluster, sim.Plan(tp=16, dp=1))


def test_flash_plan_keeps_less_and_recomputes_the_scores():
    model, cluster = sim.Model.preset("llama-2-7b"), sim.Cluster.preset("H100-80GB")
    plans = {att: sim.Plan(zero_stage=1, dp=8, attention=att, micro_batch_size=1) for att in ("eager", "flash")}
    res = {att: sim.simulate(model, cluster, p) for att, p in plans.items()}
    acts = {att: r.memory.peak(0, "gpu")["activation"] for att, r in res.items()}
    per_layer = {att: model.activation_terms(1, attention=att).total for att in plans}
    assert acts["eager"] - acts["flash"] == model.layers * (per_layer["eager"] - per_layer["flash"])
    assert per_layer["eager"] - per_layer["flash"] == 2 * 32 * model.seq ** 2 - 4 * 32 * model.seq
    # flash's backward recomputes QKᵀ: half the attention core's forward FLOPs more
    assert layer_backward_flops(model, 1, "none", "flash") - layer_backward_flops(model, 1) == \
        attention_core_flops(model, 1) / 2
    assert res["flash"].step_time < res["eager"].step_time  # the s² element-wise traffic is gone
    with pytest.raises(ValueError, match="Plan.attention"):
        sim.Plan(attention="ring")
