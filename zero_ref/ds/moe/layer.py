"""DeepSpeed's ``deepspeed.moe.layer.MoE``: a gate and copies of an expert module, returning
``(output, l_aux, exp_counts)``.

    moe = MoE(hidden_size=d, expert=my_mlp, num_experts=4, ep_size=1, k=2)
    out, l_aux, exp_counts = moe(x)          # x: (..., d); loss = task_loss + coef * l_aux

It routes as DeepSpeed 0.19.8's ``top1gating`` / ``top2gating`` (moe/sharded_moe.py) do, with the same
operations in the same order so that the same weights, inputs and random state give the same tokens
kept, the same weights and the same ``l_aux``:

- the gate is ``Linear(hidden_size, num_experts, bias=False)`` on fp32 inputs (``deepspeed_moe.gate.wg``);
- capacity per expert: ceil(tokens / experts · capacity_factor), × 2 for top-2, at least ``min_capacity``
  (``eval_capacity_factor`` in eval mode); ``drop_tokens=False``: the largest expert load instead;
- top-1: the most probable expert; when it is full, DeepSpeed keeps the tokens with the largest of a
  uniform random draw (``use_rts``, random token selection) — the same draw here — or, without it, those
  ``torch.topk`` picks; a kept token's weight is its gate probability;
- top-2: the second expert is the most probable other one after Gumbel noise on the logits
  (``top2_2nd_expert_sampling``, the same draw here); first choices fill the slots before second
  choices, in token order; the two weights are renormalised to sum to 1;
- ``l_aux`` = E · Σ_e mean probability_e · share of first choices_e; ``exp_counts``: tokens per expert
  before any is dropped.

The dispatch is zero_ref's: tokens scattered into (experts, capacity, d) slots, one all-to-all over the
expert-parallel group (``ep_size`` consecutive ranks, as DeepSpeed groups them), the local experts,
the all-to-all back, a weighted sum (``zero_ref.parallel.moe``).

Simplified vs DeepSpeed: k ≤ 2, no ``use_residual``, no noisy gate policies, no Tutel, no expert tensor
parallelism (each refused with its name). zero_ref's engine averages every gradient over all data-parallel
ranks, which is right for experts only at ``ep_size`` 1; with ``ep_size`` > 1 reduce the gradients with
``zero_ref.parallel.moe.reduce_gradients`` (the engine refuses such a model).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from zero_ref.parallel.moe import Routing, all_to_all

__all__ = ["MoE", "deepspeed_gating"]


def _capacity(tokens: int, num_experts: int, capacity_factor: float, min_capacity: int) -> int:
    # DeepSpeed's _capacity multiplies in float32 (a python float times torch.tensor(capacity_factor))
    c = torch.ceil((tokens / num_experts) * torch.tensor(capacity_factor)).to(torch.int64)
    return int(torch.maximum(c, torch.tensor(min_capacity).to(torch.int64)))


def _largest_load(counts: torch.Tensor, ep_group) -> int:
    c = counts.max().clone()
    if ep_group is not None and dist.get_world_size(ep_group) > 1:
        dist.all_reduce(c, op=dist.ReduceOp.MAX, group=ep_group)
    return int(c)


def deepspeed_gating(logits: torch.Tensor, k: int, capacity_factor: float, min_capacity: int, drop_tokens: bool = True,
                     use_rts: bool = True, second_expert_sampling: bool = True, ep_group=None):
    """``(Routing, exp_counts)`` for N tokens' router logits (N, E), by DeepSpeed's top-1 / top-2 rules."""
    n, e = logits.shape
    gates = F.softmax(logits, dim=1)
    first = torch.argmax(gates, dim=1)
    mask1 = F.one_hot(first, num_classes=e)
    if k == 1:
        counts = mask1.sum(0).detach()
        c = _capacity(n, e, capacity_factor, min_capacity) if drop_tokens else min(_largest_load(counts, ep_group), n)
        aux = (gates.mean(0) * mask1.float().mean(0)).sum() * e
        if n < min_capacity:
            raise ValueError(f"MoE: {n} tokens is fewer than min_capacity={min_capacity} (DeepSpeed asserts the same); "
                             "set min_capacity=0 or use a larger batch")
        ranked = mask1 * torch.distributions.uniform.Uniform(torch.tensor(0.0), torch.tensor(1.0)).rsample(
            mask1.shape) if use_rts else mask1
        top = torch.topk(ranked, k=min(c, n), dim=0)[1]
        mask1 = mask1 * torch.zeros_like(mask1).scatter_(0, top, 1)
        location = ((torch.cumsum(mask1, dim=0) - 1) * mask1).sum(1)
        kept = mask1.sum(1) > 0
        weight = (gates * mask1).sum(1)
        return Routing(first.unsqueeze(1), (first * c + location).unsqueeze(1), weight.unsqueeze(1),
                       kept.unsqueeze(1), c, aux), counts
    if second_expert_sampling:
        logits = logits + torch.distributions.gumbel.Gumbel(torch.tensor(0.0), torch.tensor(1.0)).rsample(logits.shape)
    second = torch.argmax(logits.masked_fill(mask1.bool(), float("-inf")), dim=1)
    mask2 = F.one_hot(second, num_classes=e)
    loc1 = torch.cumsum(mask1, dim=0) - 1
    loc2 = torch.cumsum(mask2, dim=0) - 1 + mask1.sum(0, keepdim=True)  # second choices queue behind all first ones
    aux = (gates.mean(0) * mask1.float().mean(0)).mean() * e * e
    counts = (mask1 + mask2).sum(0).detach()
    if drop_tokens:
        c = _capacity(n, e, capacity_factor * 2, min_capacity)
        mask1, mask2 = mask1 * torch.lt(loc1, c), mask2 * torch.lt(loc2, c)
    else:
        c = _largest_load(counts, ep_group)
    g1, g2 = (gates * mask1.float()).sum(1), (gates * mask2.float()).sum(1)
    denom = torch.clamp(g1 + g2, min=torch.finfo(g1.dtype).eps)
    experts = torch.stack([first, second], 1)
    location = torch.stack([(loc1 * mask1).sum(1), (loc2 * mask2).sum(1)], 1)
    kept = torch.stack([mask1.sum(1) > 0, mask2.sum(1) > 0], 1)
    return Routing(experts, experts * c + location, torch.stack([g1 / denom, g2 / denom], 1), kept, c, aux), counts


class _Gate(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int):
        super().__init__()
        self.wg = nn.Linear(hidden_size, num_experts, bias=False)


class _Experts(nn.Module):
    def __init__(self, expert: nn.Module, n: int, group_name: str):
        super().__init__()
        self.deepspeed_experts = nn.ModuleList([copy.deepcopy(expert) for _ in range(n)])
        for p in self.deepspeed_experts.parameters():  # DeepSpeed's marks: not all-reduced with the dense ones
            p.allreduce, p.group_name = False, group_name


class _MoELayer(nn.Module):
    """DeepSpeed's ``MOELayer`` (module names kept, so state dicts load under either engine)."""

    def __init__(self, gate: _Gate, experts: _Experts):
        super().__init__()
        self.gate, self.experts = gate, experts


class MoE(nn.Module):
    """DeepSpeed's MoE layer (its signature): see the module docstring."""

    def __init__(self, hidden_size: int, expert: nn.Module, num_experts: int = 1, ep_size: int = 1, k: int = 1,
                 capacity_factor: float = 1.0, eval_capacity_factor: float = 1.0, min_capacity: int = 4,
                 use_residual: bool = False, noisy_gate_policy: str | None = None, drop_tokens: bool = True,
                 use_rts: bool = True, use_tutel: bool = False, enable_expert_tensor_parallelism: bool = False,
                 top2_2nd_expert_sampling: bool = True):
        super().__init__()
        refused = {"use_residual": use_residual, "noisy_gate_policy": noisy_gate_policy not in (None, "None"),
                   "use_tutel": use_tutel, "enable_expert_tensor_parallelism": enable_expert_tensor_parallelism}
        if any(refused.values()):
            raise ValueError(f"MoE: {', '.join(k for k, v in refused.items() if v)} not supported by zero_ref's MoE "
                             "(DeepSpeed's options; leave them at their defaults)")
        if k not in (1, 2):
            raise ValueError(f"MoE: k={k} is not supported by zero_ref's MoE (top-1 and top-2, as DeepSpeed's "
                             "top1gating / top2gating; DeepSpeed's general topkgating is not implemented)")
        if num_experts % ep_size:
            raise ValueError(f"MoE: number of experts ({num_experts}) should be divisible by expert parallel size "
                             f"({ep_size}) (DeepSpeed asserts the same)")
        self.num_experts, self.ep_size, self.k = num_experts, ep_size, k
        self.num_local_experts = num_experts // ep_size
        self.capacity_factor, self.eval_capacity_factor = capacity_factor, eval_capacity_factor
        self.min_capacity, self.drop_tokens, self.use_rts = min_capacity, drop_tokens, use_rts
        self.top2_2nd_expert_sampling = top2_2nd_expert_sampling
        self.expert_group_name = f"ep_size_{ep_size}"
        # built in DeepSpeed's order (the expert copies, then the gate's Linear): the same seed, the same weights
        experts = _Experts(expert, self.num_local_experts, self.expert_group_name)
        self.deepspeed_moe = _MoELayer(_Gate(hidden_size, num_experts), experts)
        self.ep_group, self.ep_rank = None, 0
        if ep_size > 1:
            world = dist.get_world_size()
            if world % ep_size:
                raise ValueError(f"MoE: ep_size={ep_size} must divide the world size ({world})")
            for i in range(world // ep_size):  # blocks of ep_size consecutive ranks, as DeepSpeed's groups
                g = dist.new_group(list(range(i * ep_size, (i + 1) * ep_size)))
                if dist.get_rank() // ep_size == i:
                    self.ep_group, self.ep_rank = g, dist.get_rank() % ep_size
        self.l_aux: torch.Tensor | None = None
        self.exp_counts: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor, used_token: torch.Tensor | None = None):
        """``(output, l_aux, exp_counts)``: the output has the input's shape."""
        if used_token is not None:
            raise ValueError("MoE: used_token is not supported by zero_ref's MoE")
        shape, d = hidden_states.shape, hidden_states.shape[-1]
        tokens = hidden_states.reshape(-1, d)
        logits = F.linear(tokens.float(), self.deepspeed_moe.gate.wg.weight.float())
        cf = self.capacity_factor if self.training else self.eval_capacity_factor
        r, counts = deepspeed_gating(logits, self.k, cf, self.min_capacity, self.drop_tokens, self.use_rts,
                                     self.top2_2nd_expert_sampling, self.ep_group)
        self.l_aux, self.exp_counts, self.routing = r.aux_loss, counts, r
        e, c, ep, local = self.num_experts, r.capacity, self.ep_size, self.num_local_experts
        src = torch.arange(tokens.shape[0]).unsqueeze(1).expand_as(r.slot)[r.kept]
        slots = r.slot[r.kept]
        buffer = tokens.new_zeros(e * c, d).index_copy(0, slots, tokens[src])  # (E·C, d), zero padded
        if ep > 1:
            buffer = all_to_all(buffer, self.ep_group)
        # (ep, local, C, d): local expert j gets its rows from every source rank, as DeepSpeed's Experts chunks them
        rows = buffer.view(ep, local, c, d)
        out = torch.cat([expert(rows[:, j:j + 1]) for j, expert in
                         enumerate(self.deepspeed_moe.experts.deepspeed_experts)], dim=1).reshape(e * c, d)
        if ep > 1:
            out = all_to_all(out, self.ep_group)
        picked = out[slots] * r.weight[r.kept].unsqueeze(-1).to(out.dtype)
        output = tokens.new_zeros(tokens.shape).index_add(0, src, picked).view(shape)
        return output, self.l_aux, self.exp_counts
