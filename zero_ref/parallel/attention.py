"""Attention on one device, written as the blocks context parallelism needs.

Tensors are [s, b, heads, head_dim] (the sequence first, as in ``mappings`` and DeepSpeed's
``DistributedAttention``). ``causal_attention`` is the single-device reference. The two block
functions are FlashAttention's split of the same computation: ``block_forward`` attends a block of
queries to a block of keys and returns the output with its log-sum-exp per query (the softmax
statistics: all that backward needs of the s × s scores), ``merge`` combines two blocks' results
exactly (the online softmax), and ``block_backward`` recomputes one block's probabilities from the
final log-sum-exp to give that block's share of dQ, dK, dV. Masks are boolean, True = may attend.
"""
from __future__ import annotations

import math

import torch


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(QKᵀ/√d + causal mask) V on [s, b, heads, d] tensors; the reference."""
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"causal_attention: q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    s = q.shape[0]
    qh, kh, vh = (t.permute(1, 2, 0, 3) for t in (q, k, v))               # [b, heads, s, d]
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    out = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ vh
    return out.permute(2, 0, 1, 3)


def block_forward(q, k, v, mask):
    """(out, lse) of queries q [b, H, sq, d] over keys k, v [b, H, sk, d] under ``mask`` [sq, sk].

    A query row with no key allowed gets out = 0 and lse = −inf (it contributes nothing to a merge)."""
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
    peak = scores.amax(-1, keepdim=True)
    peak = torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)   # an all-masked row: exp(−inf) = 0
    p = torch.exp(scores - peak)
    total = p.sum(-1, keepdim=True)
    out = (p @ v) / total.clamp_min(torch.finfo(total.dtype).tiny)
    return out, (peak + total.log()).squeeze(-1)


def merge(out, lse, block_out, block_lse):
    """Combine two partial attentions over disjoint key sets: weights exp(lse − new lse).

    ``lse`` must be finite in every row (start from a block where each query sees a key)."""
    new = torch.logaddexp(lse, block_lse)
    out = out * torch.exp(lse - new).unsqueeze(-1) + block_out * torch.exp(block_lse - new).unsqueeze(-1)
    return out, new


def block_backward(q, k, v, out, lse, dout, mask):
    """(dq, dk, dv): this key block's share of the gradients, given the *final* out and lse.

    P = exp(S − lse) is the block's slice of the full softmax; dS = P ∘ (dP − rowsum(dO ∘ O))."""
    scale = 1 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    p = torch.exp(scores - lse.unsqueeze(-1))
    dv = p.transpose(-1, -2) @ dout
    dp = dout @ v.transpose(-1, -2)
    ds = p * (dp - (dout * out).sum(-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-1, -2) @ q * scale, dv
