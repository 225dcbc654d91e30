"""A small GPT-2-style (pre-LayerNorm) model, written so every saved activation is visible.

Used across the course as the toy model for data parallelism, ZeRO and memory accounting.
Attention is spelled out with explicit ops (no ``scaled_dot_product_attention``) and dropout
uses ``torch.native_dropout`` (a 1-byte boolean mask on every device; ``F.dropout`` on CPU
saves a full-width scaled-noise tensor instead). With those choices the tensors autograd saves
per block match Korthikanti et al. (arXiv 2205.05198) term by term: 34·s·b·h + 5·a·s²·b bytes
in 16-bit, plus LayerNorm's per-token mean and rstd (see tests/zero_ref/test_models_measure.py).

The LLaMA-style options keep that property for the blocks trained today (each term is in
zero_ref.memory.activation_terms, checked in tests/zero_ref/test_activation_terms.py): ``n_kv_heads``
(grouped-query attention), ``attention="flash"`` (torch's scaled_dot_product_attention, which
keeps the softmax statistics instead of the s×s scores), ``mlp="swiglu"`` (a fused SwiGLU that
keeps the gate and up projections' output, as Megatron's does), ``norm="rmsnorm"`` (a fused
RMSNorm keeping its input and an fp32 rstd per token) and ``recompute`` ("selective": the
attention core, "full": the whole block).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from zero_ref.memory import transformer_param_count
from zero_ref.models.dropout import dropout


@dataclass
class GPTConfig:
    vocab_size: int = 1024
    seq_len: int = 64
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    ffn_mult: int = 4
    dropout: float = 0.0
    bias: bool = True            # biases of the Linear layers (LayerNorms always have them)
    tie_embeddings: bool = True
    n_kv_heads: int | None = None     # grouped-query attention: key/value heads (None: n_heads)
    ffn_hidden: int | None = None     # the MLP width (None: ffn_mult × d_model)
    mlp: str = "gelu"                 # "gelu" | "swiglu"
    norm: str = "layernorm"           # "layernorm" | "rmsnorm"
    attention: str = "eager"          # "eager" | "flash"
    attention_dropout: float | None = None  # dropout on the attention probabilities (None: dropout)
    recompute: str = "none"           # "none" | "selective" | "full", per block

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        for key, value, choices in (("mlp", self.mlp, ("gelu", "swiglu")), ("norm", self.norm, ("layernorm", "rmsnorm")),
                                    ("attention", self.attention, ("eager", "flash")),
                                    ("recompute", self.recompute, ("none", "selective", "full"))):
            if value not in choices:
                raise ValueError(f"GPTConfig.{key} must be one of {choices}, got {value!r}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or self.ffn_mult * self.d_model

    def num_params(self) -> int:
        """Parameter count of ``GPT(self)``, from the closed form (tied weights counted once)."""
        return transformer_param_count(self.n_layers, self.d_model, self.vocab_size,
                                       seq_len=self.seq_len, ffn_hidden=self.ffn,
                                       bias=self.bias, tied=self.tie_embeddings, gated=self.mlp == "swiglu",
                                       norm=self.norm, heads=self.n_heads, kv_heads=self.kv_heads)


class RMSNorm(nn.Module):
    """x / rms(x) · weight, keeping for backward only its input and an fp32 rstd per token (as the
    fused CUDA kernels do; torch's nn.RMSNorm on CPU keeps fp32 copies of the whole activation)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNorm.apply(x, self.weight, self.eps)


def _acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in at least fp32 (16-bit inputs are computed in fp32, as the fused kernels do)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(_acc(x).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (_acc(x) * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = _acc(x) * rstd
        g = _acc(grad) * _acc(weight)
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (_acc(grad) * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


def norm_layer(cfg: GPTConfig) -> nn.Module:
    return nn.LayerNorm(cfg.d_model) if cfg.norm == "layernorm" else RMSNorm(cfg.d_model)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) · up from one [..., 2f] tensor, keeping only that tensor for backward (Megatron's
    fused bias_swiglu does the same; the backward recomputes silu)."""

    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate_up, = ctx.saved_tensors
        gate, up = _acc(gate_up).chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        d_gate = _acc(grad) * up * sig * (1 + gate * (1 - sig))
        return torch.cat([d_gate, _acc(grad) * gate * sig], dim=-1).to(gate_up.dtype)


swiglu = _SwiGLU.apply


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.p = cfg.n_heads, cfg.kv_heads, cfg.dropout
        self.p_attn = cfg.dropout if cfg.attention_dropout is None else cfg.attention_dropout
        self.flash, self.selective = cfg.attention == "flash", cfg.recompute == "selective"
        self.kv_dim = cfg.kv_heads * (cfg.d_model // cfg.n_heads)
        # q, k, v from one projection (saves its input x); k and v are kv_heads wide
        self.qkv = nn.Linear(cfg.d_model, cfg.d_model + 2 * self.kv_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)      # saves its input y
        # Additive mask (0 on and below the diagonal, -inf above): an add saves nothing for
        # backward, whereas masked_fill/where would save the boolean mask.
        mask = torch.full((cfg.seq_len, cfg.seq_len), float("-inf")).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T, hd = q.shape[2], q.shape[3]
        p = self.p_attn if self.training else 0.0
        if self.flash:  # keeps q, k, v, its output and an fp32 log-sum-exp per head and token
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                                  enable_gqa=self.n_kv_heads != self.n_heads)
        if self.n_kv_heads != self.n_heads:  # expand each key/value head to its group (a copy, as HF's repeat_kv)
            B, g = k.shape[:2]
            k, v = (u[:, :, None].expand(B, g, self.n_heads // g, T, hd).reshape(B, self.n_heads, T, hd)
                    for u in (k, v))
        # matmul copies the strided q, k (and below v) into contiguous tensors and saves those
        # copies: Q and K (4sbh), V (2sbh). Scaling the scores by a Python float saves nothing.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att + self.causal_mask[:T, :T].to(att.dtype)
        att = torch.softmax(att, dim=-1)                               # saves its output: 2as²b
        att = dropout(att, p, True)                                    # saves a mask: as²b
        return att @ v                                                 # saves att (2as²b) and V

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hd = C // self.n_heads
        q, k, v = self.qkv(x).split([C, self.kv_dim, self.kv_dim], dim=2)  # views of one output
        q = q.view(B, T, self.n_heads, hd).transpose(1, 2)
        k, v = (t.view(B, T, self.n_kv_heads, hd).transpose(1, 2) for t in (k, v))
        if self.selective and self.training:  # keep q, k, v (the one projection output); redo the core
            y = checkpoint(self.core, q, k, v, use_reentrant=True)
        else:
            y = self.core(q, k, v)
        y = y.transpose(1, 2).reshape(B, T, C)  # a view of flash's output; a copy of eager's
        return dropout(self.proj(y), self.p, self.training)           # proj input 2sbh, mask sbh


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.p, self.gated = cfg.dropout, cfg.mlp == "swiglu"
        # SwiGLU: fc1 holds the gate and up projections side by side (2f outputs), fc2 is the down projection
        self.fc1 = nn.Linear(cfg.d_model, (2 if self.gated else 1) * cfg.ffn, bias=cfg.bias)
        self.fc2 = nn.Linear(cfg.ffn, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fc1 saves x (2sbh); gelu saves its input (2sbf), swiglu the gate and up outputs (4sbf);
        # fc2 saves its input (2sbf).
        act = swiglu if self.gated else F.gelu
        return dropout(self.fc2(act(self.fc1(x))), self.p, self.training)  # mask sbh


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = norm_layer(cfg)   # each norm saves its input (2sbh) and per-token statistics
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = norm_layer(cfg)
        self.mlp = MLP(cfg)
        self.full_recompute = cfg.recompute == "full"

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))                        # residual adds save nothing
        return x + self.mlp(self.ln2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.full_recompute and self.training:  # keep the block's input only
            return checkpoint(self._forward, x, use_reentrant=True)
        return self._forward(x)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = norm_layer(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight           # one Parameter, one storage
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds cfg.seq_len={self.cfg.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = dropout(self.tok_emb(idx) + self.pos_emb(pos), self.cfg.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def make_batch(cfg: GPTConfig, batch_size: int, seed: int = 0, device="cpu"):
    """Deterministic random tokens: ``(idx, targets)``, targets = idx shifted left by one."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, cfg.vocab_size, (batch_size, cfg.seq_len + 1), generator=g)
    return data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)
