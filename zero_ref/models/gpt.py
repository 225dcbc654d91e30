"""A small GPT-2-style (pre-LayerNorm) model, written so every saved activation is visible.

Used across the course as the toy model for data parallelism, ZeRO and memory accounting.
Attention is spelled out with explicit ops (no ``scaled_dot_product_attention``) and dropout
uses ``torch.native_dropout`` (a 1-byte boolean mask on every device; ``F.dropout`` on CPU
saves a full-width scaled-noise tensor instead). With those choices the tensors autograd saves
per block match Korthikanti et al. (arXiv 2205.05198) term by term: 34·s·b·h + 5·a·s²·b bytes
in 16-bit, plus LayerNorm's per-token mean and rstd (see tests/test_models_measure.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from zero_ref.memory import transformer_param_count


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

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")

    def num_params(self) -> int:
        """Parameter count of ``GPT(self)``, from the closed form (tied weights counted once)."""
        return transformer_param_count(self.n_layers, self.d_model, self.vocab_size,
                                       seq_len=self.seq_len, ffn_hidden=self.ffn_mult * self.d_model,
                                       bias=self.bias, tied=self.tie_embeddings)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that saves a 1-byte mask for backward (what the fused CUDA kernel does)."""
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads, self.p = cfg.n_heads, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)   # saves its input x
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)      # saves its input y
        # Additive mask (0 on and below the diagonal, -inf above): an add saves nothing for
        # backward, whereas masked_fill/where would save the boolean mask.
        mask = torch.full((cfg.seq_len, cfg.seq_len), float("-inf")).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hd = C // self.n_heads
        q, k, v = self.qkv(x).split(C, dim=2)                          # views of one (B,T,3C) output
        q, k, v = (t.view(B, T, self.n_heads, hd).transpose(1, 2) for t in (q, k, v))
        # matmul copies the strided q, k (and below v) into contiguous tensors and saves those
        # copies: Q and K (4sbh), V (2sbh). Scaling the scores by a Python float saves nothing.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att + self.causal_mask[:T, :T].to(att.dtype)
        att = torch.softmax(att, dim=-1)                               # saves its output: 2as²b
        att = dropout(att, self.p, self.training)                     # saves a mask: as²b
        y = att @ v                                                    # saves att (2as²b) and V
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return dropout(self.proj(y), self.p, self.training)           # proj input 2sbh, mask sbh


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.p = cfg.dropout
        self.fc1 = nn.Linear(cfg.d_model, cfg.ffn_mult * cfg.d_model, bias=cfg.bias)
        self.fc2 = nn.Linear(cfg.ffn_mult * cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fc1 saves x (2sbh), gelu saves its input (8sbh), fc2 saves gelu's output (8sbh).
        return dropout(self.fc2(F.gelu(self.fc1(x))), self.p, self.training)  # mask sbh


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)   # each LN saves its input (2sbh)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))                        # residual adds save nothing
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
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
