"""Cutting a model into pipeline stages: balanced contiguous layer ranges, and a GPT's stage module.

    partition([1, 1, 1, 5], 2)          # [range(0, 3), range(3, 4)]: the largest stage cost is minimal
    stages = split_gpt(model, 4)        # four GPTStage modules; stage 0 embeds, stage 3 ends in the loss

Stages must be contiguous (activations flow from one to the next), and a pipeline runs at the pace
of its slowest stage, so the split minimizes the largest stage cost: parameters by default (DeepSpeed's
``partition_method="parameters"``), one block each (``"layers"``, Megatron's even split), or any
per-layer cost, e.g. measured time.
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from zero_ref.models.dropout import dropout
from zero_ref.parallel.tensor import TensorParallelGPT

if TYPE_CHECKING:
    from zero_ref.models.gpt import GPT


def partition(costs: list[float], parts: int) -> list[range]:
    """Split layers 0..n−1 into ``parts`` contiguous, non-empty ranges minimizing the largest cost.

    ``costs[i]`` is layer i's cost (parameters, FLOPs, measured time). Dynamic programming over
    (layers used, parts used): exact, O(parts·n²). Ties go to the split that fills earlier parts.
    """
    n = len(costs)
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"partition: parts must be a positive integer, got {parts!r}")
    if any(c < 0 for c in costs):
        raise ValueError(f"partition: costs must be non-negative, got {list(costs)}")
    if n < parts:
        raise ValueError(f"partition: {n} layers cannot be split into {parts} stages: every stage needs at "
                         f"least one layer (use fewer stages or virtual chunks, or a deeper model)")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]  # best[k][i]: first i layers in k parts
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(i - 1, k - 2, -1):  # last part = layers j..i−1; larger j first: earlier parts fuller
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    bounds, i = [], n
    for k in range(parts, 0, -1):
        bounds.append(range(cut[k][i], i))
        i = cut[k][i]
    return bounds[::-1]


class GPTStage(nn.Module):
    """Blocks [lo, hi) of a ``GPT`` or a ``TensorParallelGPT``, with the embeddings on the first
    stage and the final LayerNorm, head and loss on the last.

    forward(x, targets=None): token ids [b, s] (first stage) or hidden states in; hidden states
    out ([b, s, h]; a tensor-parallel model's are [s, b, h], Megatron's layout), or on the last
    stage the mean cross-entropy against ``targets``."""

    def __init__(self, model: GPT | TensorParallelGPT, lo: int, hi: int):
        super().__init__()
        self.cfg, self.lo, self.hi = model.cfg, lo, hi
        self.is_first, self.is_last = lo == 0, hi == model.cfg.n_layers
        self.tensor_parallel = isinstance(model, TensorParallelGPT)
        if self.tensor_parallel:
            self.group, self.sequence_parallel = model.group, model.sequence_parallel
        if self.is_first:
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        if self.is_last:
            self.ln_f, self.head = model.ln_f, model.head

    def activation_shape(self, batch: int, seq: int) -> tuple[int, int, int]:
        """The shape of the hidden states this stage passes on, for micro-batches of [batch, seq]."""
        return (seq, batch, self.cfg.d_model) if self.tensor_parallel else (batch, seq, self.cfg.d_model)

    def gpt_state_dict(self, keep_vars: bool = False) -> dict[str, torch.Tensor]:
        """This stage's tensors under the names they have in the whole ``GPT`` (blocks renumbered)."""
        out = {}
        for name, t in self.state_dict(keep_vars=keep_vars).items():
            if name.startswith("blocks."):
                j, rest = name[len("blocks."):].split(".", 1)
                name = f"blocks.{self.lo + int(j)}.{rest}"
            out[name] = t
        return out

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.is_first and self.tensor_parallel:
            x = TensorParallelGPT.embed(self, x)  # the TP model's own code: this stage has its attributes
        elif self.is_first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = dropout(self.tok_emb(x) + self.pos_emb(pos), self.cfg.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        if not self.is_last:
            return x
        if self.tensor_parallel:
            return TensorParallelGPT.head_loss(self, x, targets)[1]
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def split_gpt(model: GPT | TensorParallelGPT, parts: int, costs: str | list[float] = "params") -> list[GPTStage]:
    """Cut a copy of ``model`` into ``parts`` GPTStages (virtual stages, in order).

    ``costs``: 'params' balances parameter counts (the embeddings count towards the first block,
    the head towards the last), 'layers' gives each stage the same number of blocks (±1), or a
    list of one cost per block. With tied embeddings and parts > 1 the last stage gets its own
    copy of the word embedding as head weight; ``Pipeline`` keeps both copies equal by summing
    their gradients.
    """
    # A copy, so the caller's model (e.g. a single-process reference) stays whole; process groups
    # are handles, not state: the copy shares them.
    groups = {id(m.group): m.group for m in model.modules() if hasattr(m, "group")}
    original, model = model, copy.deepcopy(model, memo=groups)
    for old, new in zip(original.parameters(), model.parameters()):
        new.__dict__.update(old.__dict__)  # deepcopy drops a Parameter's attributes (e.g. its TP slice)
    L = model.cfg.n_layers
    if costs == "params":
        def count(*mods):
            return float(sum(p.numel() for mod in mods for p in mod.parameters()))
        costs = [count(b) for b in model.blocks]
        costs[0] += count(model.tok_emb, model.pos_emb)
        costs[-1] += count(model.ln_f) + model.head.weight.numel()
    elif costs == "layers":
        costs = [1.0] * L
    elif isinstance(costs, str) or len(costs) != L:
        raise ValueError(f"split_gpt: costs must be 'params', 'layers' or one number per block ({L}), got {costs!r}")
    ranges = partition(costs, parts)
    if model.cfg.tie_embeddings and parts > 1:
        old = model.tok_emb.weight
        model.head.weight = nn.Parameter(old.detach().clone())
        model.head.weight.__dict__.update(old.__dict__)  # e.g. which tensor-parallel slice it is
    return [GPTStage(model, r.start, r.stop) for r in ranges]
