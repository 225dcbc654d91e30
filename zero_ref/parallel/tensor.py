"""Tensor parallelism (Megatron-LM style) and sequence parallelism, on a tensor-parallel group.

A linear layer Y = X·Wᵀ splits two ways across the t ranks of a tensor-parallel group:

- column-parallel: rank r holds rows r of W (output features r): Y_r = X·W_rᵀ needs the full X
  and gives a slice of Y's features;
- row-parallel: rank r holds columns r of W (input features r): X_r·W_rᵀ is a partial sum of the
  full Y, so the ranks add their partials with one all-reduce.

Column then row (attention: QKV then the output projection, heads split; MLP: fc1 then fc2) needs
no communication in between, so a transformer block costs one all-reduce of the b·s·h activation
per sub-layer in forward (``reduce_from_tp``) and one in backward (``copy_to_tp``). Nothing here is
all-to-all: tensor parallelism uses all-reduce, or with sequence parallelism all-gather and
reduce-scatter (all-to-all belongs to expert parallelism, where tokens move to their experts).

Sequence parallelism (Korthikanti et al., arXiv 2205.05198) splits the rest of the block — the
LayerNorms, dropouts and residual adds, which tensor parallelism replicates — along the sequence.
Each all-reduce becomes a reduce-scatter (leaving the block in sequence shards) and an all-gather
(entering the next column-parallel layer): the same ring traffic, with every activation 1/t.

Activations are laid out [s, b, h] as in Megatron, so a sequence shard is a contiguous slice and
the sequence collectives need no copies. The communication helpers are autograd functions named
after what they do in forward (``zero_ref.parallel.mappings``, re-exported here). Every collective
goes through ``zero_ref.comm`` and is counted inside ``comm.recording()``.
"""
from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from zero_ref import comm
from zero_ref.models.dropout import dropout
from zero_ref.parallel.mappings import (_LinearGatherSequence, copy_to_tp, gather_from_sequence,  # noqa: F401
                                        gather_from_tp, reduce_from_tp, reduce_scatter_to_sequence,
                                        scatter_to_sequence, scatter_to_tp)

if TYPE_CHECKING:  # (built from the course GPT's modules; the layers read only their weights and sizes)
    from zero_ref.models.gpt import GPT, MLP, Block, CausalSelfAttention


def shard(t: torch.Tensor, dim: int, rank: int, size: int, chunks: int = 1) -> torch.Tensor:
    """Rank ``rank``'s part of ``t`` along ``dim``: cut into ``chunks`` blocks (e.g. Q, K, V), take piece ``rank`` of each."""
    if t.shape[dim] % (chunks * size):
        raise ValueError(f"shard: dim {dim} of shape {tuple(t.shape)} does not split into {chunks}×{size} parts")
    return torch.cat([c.chunk(size, dim)[rank] for c in t.chunk(chunks, dim)], dim).clone()


def _mark(p: nn.Parameter, dim: int, chunks: int = 1) -> None:
    # Which slice of the single-device tensor this is (Megatron's partition_dim / partition_stride).
    p.partition_dim, p.partition_chunks = dim, chunks


def local_part(param: nn.Parameter, full: torch.Tensor, group) -> torch.Tensor:
    """This rank's part of ``full``, the single-device counterpart of ``param`` (itself if replicated)."""
    if getattr(param, "partition_dim", None) is None:
        return full
    rank, t = _tp(group)
    return shard(full, param.partition_dim, rank, t, param.partition_chunks)


def _tp(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def _divisible(what: str, n: int, t: int) -> None:
    if n % t:
        raise ValueError(f"{what}={n} is not divisible by the tensor-parallel size {t}")


class ColumnParallelLinear(nn.Module):
    """Y[..., out/t] = X·W_rᵀ + b_r with rank r's rows of W; X is replicated (or, with
    ``sequence_parallel``, sequence shards that are all-gathered first)."""

    def __init__(self, in_features, out_features, group, *, bias=True, gather_output=False,
                 sequence_parallel=False, dtype=None):
        super().__init__()
        _, t = _tp(group)
        _divisible("ColumnParallelLinear: out_features", out_features, t)
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        self.weight = nn.Parameter(torch.empty(out_features // t, in_features, dtype=dtype).normal_(0, 0.02))
        self.bias = nn.Parameter(torch.zeros(out_features // t, dtype=dtype)) if bias else None
        for p in self.parameters():
            _mark(p, 0)  # a shard of the output features, different on every tp rank

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, *, chunks=1, **kw):
        """Rank r's shard of ``linear``; ``chunks=3`` shards Q, K and V separately (heads stay whole)."""
        rank, t = _tp(group)
        m = cls(linear.in_features, linear.out_features, group, bias=linear.bias is not None,
                dtype=linear.weight.dtype, **kw)
        with torch.no_grad():
            m.weight.copy_(shard(linear.weight, 0, rank, t, chunks))
            if m.bias is not None:
                m.bias.copy_(shard(linear.bias, 0, rank, t, chunks))
        for p in m.parameters():
            _mark(p, 0, chunks)
        return m

    def forward(self, x):
        if self.sequence_parallel:
            y = _LinearGatherSequence.apply(x, self.weight, self.bias, self.group)
        else:
            y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)
        return gather_from_tp(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """Y = Σ_r X_r·W_rᵀ + b with rank r's columns of W: an all-reduce of the partial sums (or, with
    ``sequence_parallel``, a reduce-scatter into sequence shards); b is added once, after."""

    def __init__(self, in_features, out_features, group, *, bias=True, input_is_parallel=True,
                 sequence_parallel=False, dtype=None):
        super().__init__()
        _, t = _tp(group)
        _divisible("RowParallelLinear: in_features", in_features, t)
        self.group, self.input_is_parallel, self.sequence_parallel = group, input_is_parallel, sequence_parallel
        self.weight = nn.Parameter(torch.empty(out_features, in_features // t, dtype=dtype).normal_(0, 0.02))
        _mark(self.weight, 1)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        if self.bias is not None:  # replicated; with SP each rank's gradient covers only its sequence shard
            self.bias.sequence_parallel = sequence_parallel

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, **kw):
        rank, t = _tp(group)
        m = cls(linear.in_features, linear.out_features, group, bias=linear.bias is not None,
                dtype=linear.weight.dtype, **kw)
        with torch.no_grad():
            m.weight.copy_(shard(linear.weight, 1, rank, t))
            if m.bias is not None:
                m.bias.copy_(linear.bias)
        return m

    def forward(self, x):
        x = x if self.input_is_parallel else scatter_to_tp(x, self.group)
        y = F.linear(x, self.weight)
        y = reduce_scatter_to_sequence(y, self.group) if self.sequence_parallel else reduce_from_tp(y, self.group)
        return y + self.bias if self.bias is not None else y


class ParallelAttention(nn.Module):
    """Causal self-attention with heads split over the tp ranks: QKV column-parallel (each rank
    computes a/t whole heads), output projection row-parallel. Input and output [s, b, h]."""

    def __init__(self, attn: CausalSelfAttention, group, *, sequence_parallel=False, recompute="none"):
        super().__init__()
        _, t = _tp(group)
        _divisible("ParallelAttention: n_heads", attn.n_heads, t)
        if recompute not in ("none", "selective"):
            raise ValueError(f"recompute must be 'none' or 'selective', got {recompute!r}")
        self.heads, self.p, self.recompute = attn.n_heads // t, attn.p, recompute
        self.head_dim = attn.qkv.in_features // attn.n_heads
        self.qkv = ColumnParallelLinear.from_linear(attn.qkv, group, chunks=3, sequence_parallel=sequence_parallel)
        self.proj = RowParallelLinear.from_linear(attn.proj, group, sequence_parallel=sequence_parallel)
        self.register_buffer("causal_mask", attn.causal_mask.clone(), persistent=False)

    def core(self, q, k, v):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att + self.causal_mask[:q.shape[2], :q.shape[2]].to(att.dtype)
        att = dropout(torch.softmax(att, dim=-1), self.p, self.training)
        return att @ v

    def forward(self, x):
        qkv = self.qkv(x)                                              # [s, b, 3·h/t]
        S, B = qkv.shape[:2]
        q, k, v = (u.view(S, B, self.heads, self.head_dim).permute(1, 2, 0, 3)
                   for u in qkv.split(self.heads * self.head_dim, dim=-1))
        if self.recompute == "selective":  # Korthikanti's selective recompute: keep q, k, v only
            y = checkpoint(self.core, q, k, v, use_reentrant=True)
        else:
            y = self.core(q, k, v)
        y = y.permute(2, 0, 1, 3).reshape(S, B, self.heads * self.head_dim)
        return dropout(self.proj(y), self.p, self.training)


class ParallelMLP(nn.Module):
    """fc1 column-parallel, GeLU on each rank's slice, fc2 row-parallel: one all-reduce."""

    def __init__(self, mlp: MLP, group, *, sequence_parallel=False):
        super().__init__()
        self.p = mlp.p
        self.fc1 = ColumnParallelLinear.from_linear(mlp.fc1, group, sequence_parallel=sequence_parallel)
        self.fc2 = RowParallelLinear.from_linear(mlp.fc2, group, sequence_parallel=sequence_parallel)

    def forward(self, x):
        return dropout(self.fc2(F.gelu(self.fc1(x))), self.p, self.training)


def _replicated_layernorm(ln: nn.LayerNorm, sequence_parallel: bool) -> nn.LayerNorm:
    ln = copy.deepcopy(ln)
    for p in ln.parameters():
        p.sequence_parallel = sequence_parallel  # each rank's gradient covers only its shard
    return ln


class ParallelBlock(nn.Module):
    """A pre-LN GPT block built from a single-device ``Block``'s weights; [s, b, h] in and out
    (sequence shards [s/t, b, h] with ``sequence_parallel``). ``recompute``: "selective" recomputes
    the attention core in backward, "full" the whole block (only its input is kept, and backward
    repeats the forward's collectives)."""

    def __init__(self, block: Block, group, *, sequence_parallel=False, recompute="none"):
        super().__init__()
        if recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
        self.full_recompute = recompute == "full"
        self.ln1 = _replicated_layernorm(block.ln1, sequence_parallel)
        self.attn = ParallelAttention(block.attn, group, sequence_parallel=sequence_parallel,
                                      recompute="selective" if recompute == "selective" else "none")
        self.ln2 = _replicated_layernorm(block.ln2, sequence_parallel)
        self.mlp = ParallelMLP(block.mlp, group, sequence_parallel=sequence_parallel)

    def _forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward(self, x):
        if self.full_recompute:
            return checkpoint(self._forward, x, use_reentrant=True)
        return self._forward(x)


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows [r·V/t, (r+1)·V/t) of the table: looks up the ids it owns, zeros the
    others, then all-reduces (or, with ``sequence_parallel``, reduce-scatters: ids are [s, b])."""

    def __init__(self, emb: nn.Embedding, group, *, sequence_parallel=False):
        super().__init__()
        rank, t = _tp(group)
        _divisible("VocabParallelEmbedding: vocab size", emb.num_embeddings, t)
        self.group, self.sequence_parallel = group, sequence_parallel
        self.start = rank * emb.num_embeddings // t
        self.end = self.start + emb.num_embeddings // t
        self.weight = nn.Parameter(shard(emb.weight.detach(), 0, rank, t))
        _mark(self.weight, 0)

    def forward(self, ids):
        outside = (ids < self.start) | (ids >= self.end)
        local = F.embedding((ids - self.start).masked_fill(outside, 0), self.weight)
        local = local.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_to_sequence(local, self.group)
        return reduce_from_tp(local, self.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Forward: per-token cross-entropy of vocab-sharded logits with three all-reduces of b·s
    numbers (max, target logit, Σexp) instead of gathering b·s·V. Backward: softmax − one-hot, locally."""

    @staticmethod
    def forward(ctx, logits, targets, group, start):
        logits = logits.float()
        top = logits.max(dim=-1).values
        comm.all_reduce(top, op="max", group=group)             # the global max, for a stable exp
        shifted = logits - top.unsqueeze(-1)
        mine = (targets >= start) & (targets < start + logits.shape[-1])
        idx = (targets - start).masked_fill(~mine, 0).unsqueeze(-1)
        target_logit = shifted.gather(-1, idx).squeeze(-1).masked_fill(~mine, 0.0)
        comm.all_reduce(target_logit, group=group)              # exactly one rank owns each target
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        comm.all_reduce(sum_exp, group=group)
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, idx, mine)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad):
        softmax, idx, mine = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, idx, -mine.unsqueeze(-1).to(g.dtype))
        return g * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits, targets, group):
    """Per-token loss for logits sharded over the vocabulary (``[..., V/t]``, rank r's slice r)."""
    rank, _ = _tp(group)
    return _VocabParallelCrossEntropy.apply(logits, targets, group, rank * logits.shape[-1])


class TensorParallelGPT(nn.Module):
    """``zero_ref.models.GPT`` split over a tensor-parallel group, built from a single-device model's
    weights: vocab-parallel embedding and (tied) head, parallel blocks, vocab-parallel loss.

    ``forward(idx, targets)`` takes the same [b, s] batch on every tp rank and returns this rank's
    logits slice [b, s, V/t] (and the mean loss). With ``sequence_parallel``, call
    ``sync_sequence_parallel_grads`` after backward (as Megatron does) before using the gradients.
    Dropout draws each rank's masks from its own generator: seed the tp ranks alike so the
    replicated regions stay identical (Megatron's RNG tracker, which also gives each rank's heads
    their own masks, is not modelled).
    """

    def __init__(self, model: GPT, group, *, sequence_parallel=False, recompute="none"):
        super().__init__()
        cfg = model.cfg
        self.cfg, self.group, self.sequence_parallel = cfg, group, sequence_parallel
        self.tok_emb = VocabParallelEmbedding(model.tok_emb, group, sequence_parallel=sequence_parallel)
        self.pos_emb = copy.deepcopy(model.pos_emb)
        self.pos_emb.weight.sequence_parallel = sequence_parallel
        self.blocks = nn.ModuleList(ParallelBlock(b, group, sequence_parallel=sequence_parallel, recompute=recompute)
                                    for b in model.blocks)
        self.ln_f = _replicated_layernorm(model.ln_f, sequence_parallel)
        self.head = ColumnParallelLinear.from_linear(model.head, group, sequence_parallel=sequence_parallel)
        if cfg.tie_embeddings:  # the head's rows are the embedding's rows: the same vocabulary slice
            self.head.weight = self.tok_emb.weight

    def embed(self, idx):
        """[b, s] token ids → [s, b, h] (sequence shard [s/t, b, h] with sequence parallelism)."""
        x = self.tok_emb(idx.t())
        start = dist.get_rank(self.group) * x.shape[0] if self.sequence_parallel else 0
        x = x + self.pos_emb(torch.arange(start, start + x.shape[0], device=idx.device)).unsqueeze(1)
        return dropout(x, self.cfg.dropout, self.training)

    def head_loss(self, x, targets=None):
        """[s, b, h] (or shards) → this rank's logits [b, s, V/t] and, with targets, the mean loss."""
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits.transpose(0, 1)
        loss = vocab_parallel_cross_entropy(logits, targets.t(), self.group).mean()
        return logits.transpose(0, 1), loss

    def forward(self, idx, targets=None):
        if idx.shape[1] > self.cfg.seq_len:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds cfg.seq_len={self.cfg.seq_len}")
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head_loss(x, targets)


def sync_sequence_parallel_grads(module: nn.Module, group) -> None:
    """All-reduce (sum) the gradients of replicated parameters used on sequence shards (LayerNorms,
    row-parallel biases, position embeddings): each rank's gradient covers only its shard."""
    grads = [p.grad for p in module.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])  # one collective for all of them
        comm.all_reduce(flat, group=group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
