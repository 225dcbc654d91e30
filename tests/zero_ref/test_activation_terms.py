"""zero_ref.memory.activation_terms against the bytes real zero_ref blocks save for backward.

Every variant (attention eager / flash, dropout on / off, GeLU / SwiGLU, LayerNorm / RMSNorm,
MHA / GQA, recompute none / selective / full) is built as a bf16 zero_ref ``Block``; the tensors
autograd saves are recorded with saved-tensor hooks (zero_ref.measure.saved_activation_bytes:
each storage once, parameters skipped) and must equal the formula to the byte. Tensor and
sequence parallelism are checked on real ranks in tests/zero_ref/test_tensor_parallel.py.
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from zero_ref.measure import saved_activation_bytes
from zero_ref.memory import activation_bytes_per_layer, activation_terms, transformer_param_count
from zero_ref.models import GPT, Block, GPTConfig
from zero_ref.models.gpt import RMSNorm, swiglu

S, B, H, A, F_ = 24, 3, 64, 8, 40  # head dimension 8 ≠ s, f ≠ h: no two terms coincide by accident

VARIANTS = list(itertools.product(("eager", "flash"), (True, False), ("gelu", "swiglu"), ("layernorm", "rmsnorm"),
                                  (A, 2), ("none", "selective", "full")))


def _name(v):
    att, drop, mlp, norm, g, rc = v
    return f"{att}-{'drop' if drop else 'nodrop'}-{mlp}-{norm}-kv{g}-{rc}"


def measured(att, drop, mlp, norm, g, rc):
    # torch's CPU scaled_dot_product_attention has no dropout: with it, it falls back to the math
    # kernel (s×s tensors). The CUDA flash kernel keeps an RNG seed instead of a mask, so the
    # formula has no attention-dropout term for flash; here flash runs with the hidden dropouts only.
    cfg = GPTConfig(seq_len=S, d_model=H, n_heads=A, n_kv_heads=g, ffn_hidden=F_, mlp=mlp, norm=norm, attention=att,
                    dropout=0.1 if drop else 0.0, attention_dropout=0.0 if att == "flash" else None, recompute=rc)
    block = Block(cfg).to(torch.bfloat16).train()
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)  # as from the layer below
    with saved_activation_bytes(block) as acts:
        y = block(x)
    y.float().sum().backward()  # what was saved is what backward needs
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()
    return acts


@pytest.mark.parametrize("variant", VARIANTS, ids=[_name(v) for v in VARIANTS])
def test_saved_bytes_equal_the_formula(variant):
    att, drop, mlp, norm, g, rc = variant
    acts = measured(*variant)
    # torch's CPU LayerNorm keeps mean and rstd in the input dtype (bf16); the RMSNorm here, like
    # the CUDA kernels, keeps its rstd in fp32
    terms = activation_terms(S, B, H, A, kv_heads=g, ffn=F_, mlp=mlp, norm=norm, attention=att, dropout=drop,
                             recompute=rc, stat_bytes=2 if norm == "layernorm" else 4)
    assert acts.total == terms.total, f"{_name(variant)}\n{acts.table()}\nformula:\n{terms.table()}"


def test_korthikanti_is_the_gpt_variant():
    """Eager, dropout, GeLU 4h, LayerNorm, MHA: Korthikanti's 34sbh + 5as²b plus the norm statistics."""
    for kw in ({}, dict(tp=4), dict(tp=4, sp=True), dict(recompute="selective"), dict(tp=2, sp=True, recompute="full")):
        t = activation_terms(S, B, H, A, **kw)
        stats = t.terms.get("norm statistics", 0)
        assert t.total - stats == activation_bytes_per_layer(S, B, H, A, **kw)


def test_flash_and_llama_blocks_keep_less():
    """The terms that differ, written out: LLaMA-7B's shape at b = 1, s = 2048."""
    s, b, h, a, f = 2048, 1, 4096, 32, 11008
    gpt = activation_terms(s, b, h, a)
    llama = activation_terms(s, b, h, a, ffn=f, mlp="swiglu", norm="rmsnorm", dropout=False)
    flash = activation_terms(s, b, h, a, ffn=f, mlp="swiglu", norm="rmsnorm", dropout=False, attention="flash")
    sbh = s * b * h
    assert llama.total - flash.total == 2 * a * s * s * b - 4 * a * s * b        # scores out, log-sum-exp in
    assert llama.terms["gate and up outputs"] == 4 * s * b * f
    assert gpt.total > llama.total > flash.total
    assert flash.total == 16 * sbh + 4 * a * s * b + 6 * s * b * f + 2 * 4 * s * b
    gqa = activation_terms(s, b, h, a, kv_heads=8, attention="flash", dropout=False)
    assert flash.terms["K, V"] - gqa.terms["K, V"] == 4 * s * b * (h - 8 * h // a)


def test_tp_needs_whole_key_value_groups():
    with pytest.raises(ValueError, match="kv_heads=2"):
        activation_terms(S, B, H, A, kv_heads=2, tp=4)
    assert activation_terms(S, B, H, A, kv_heads=2, tp=2, attention="flash").terms["K, V"] == 2 * 2 * S * B * 2 * (H // A) / 2
    with pytest.raises(ValueError, match="attention"):
        activation_terms(S, B, H, A, attention="ring")


def test_llama_options_train_like_their_unfused_references():
    """The fused RMSNorm and SwiGLU give the gradients of their plain-torch definitions (float64, rtol 1e-5)."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 16, dtype=torch.float64, requires_grad=True)
    norm = RMSNorm(16).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight
    got = norm(x)
    for out, want in zip(torch.autograd.grad(got.sum() * 3, (x, norm.weight)),
                         torch.autograd.grad(ref.sum() * 3, (x, norm.weight))):
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-8)
    gu = torch.randn(5, 32, dtype=torch.float64, requires_grad=True)
    g, u = gu.chunk(2, -1)
    w = torch.randn(5, 16, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad((swiglu(gu) * w).sum(), gu)[0],
                               torch.autograd.grad((F.silu(g) * u * w).sum(), gu)[0], rtol=1e-5, atol=1e-8)


def test_llama_style_gpt_counts_its_parameters():
    cfg = GPTConfig(vocab_size=96, seq_len=S, d_model=H, n_heads=A, n_kv_heads=2, ffn_hidden=F_, mlp="swiglu",
                    norm="rmsnorm", bias=False, tie_embeddings=False, n_layers=2)
    model = GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params() == transformer_param_count(
        2, H, 96, seq_len=S, ffn_hidden=F_, bias=False, tied=False, gated=True, norm="rmsnorm", heads=A, kv_heads=2)
    assert isinstance(model.ln_f, RMSNorm) and not isinstance(model.ln_f, nn.LayerNorm)
