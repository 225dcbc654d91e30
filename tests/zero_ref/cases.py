"""Shared set-up for the ZeRO equivalence tests: an awkward toy model, data, and the reference run."""
from dataclasses import replace

import torch

from zero_ref.models import GPT, GPTConfig, make_batch
from zero_ref.optim import AdamConfig

# Awkward on purpose: an odd parameter count (13,209 trainable, 13,377 in all: no world size
# 2 or 4 divides it, so every flat buffer is padded), tied embeddings, biases, and a frozen
# parameter (the position embedding). Every parameter count is a multiple of d_model, so
# d_model must be odd for the total to be.
CFG = GPTConfig(vocab_size=97, seq_len=8, d_model=21, n_heads=3, n_layers=2)
# eps = 1e-6 rather than 1e-8: Adam's update g/(√v + eps) is ±lr whatever |g| is once |g| ≫ eps,
# so with a tiny eps an element whose true gradient is ~0 (the attention key bias: softmax is
# shift-invariant) moves by ±lr in a direction set by rounding noise, and two correct runs that
# add in different orders differ by up to 2·lr·steps there. With 1e-6 that noise stays small.
ADAM = AdamConfig(lr=1e-2, weight_decay=0.1, eps=1e-6)
MICRO_BATCH = 2


def build_model(seed: int = 0, dropout: float = 0.0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(replace(CFG, dropout=dropout))
    model.pos_emb.weight.requires_grad_(False)
    return model


def micro_batch(step: int, micro: int, rank: int, world: int, gas: int):
    """Rank ``rank``'s ``micro``-th micro-batch of optimizer step ``step`` (slices of one global batch)."""
    idx, targets = make_batch(CFG, MICRO_BATCH * world * gas, seed=1000 + step)
    start = (micro * world + rank) * MICRO_BATCH
    return idx[start:start + MICRO_BATCH], targets[start:start + MICRO_BATCH]


def reference_params(steps: int, world: int, gas: int, clip: float = 0.0) -> dict:
    """Single-process torch.optim.AdamW on the whole global batch of every step."""
    model = build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=ADAM.lr, betas=ADAM.betas, eps=ADAM.eps, weight_decay=ADAM.weight_decay,
                            foreach=False)
    for step in range(steps):
        idx, targets = make_batch(CFG, MICRO_BATCH * world * gas, seed=1000 + step)
        _, loss = model(idx, targets)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: dict, b: dict) -> float:
    """The largest |a[k] - b[k]| over the tensors of ``a`` (compared in fp32, so half-precision states work too)."""
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
