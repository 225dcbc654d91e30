"""Mixture of Experts with expert parallelism: a top-k gate, all-to-all dispatch and combine.

    layer = MoE(cfg, num_experts=8, k=2, capacity_factor=1.25, ep_group=ep_group)
    y = layer(x)                   # (B, T, d) -> (B, T, d); layer.aux_loss, layer.routing set

The gate (GShard / Switch) sends each token to its k most probable experts. Expert e takes at
most ``capacity = ceil(k·tokens·capacity_factor / num_experts)`` tokens per rank; first choices
are served before second choices, and in token order, so a token that finds its expert full is
*dropped* for that choice (it still passes through the block's residual connection).

Dispatch uses fixed capacity slots, as GShard and DeepSpeed do: every rank lays its tokens out
in an (experts, capacity, d) buffer, padded with zeros, and one equal-split all-to-all sends
expert e's rows to the rank that holds e. The alternative — all-to-all the per-expert counts
first, then only the real tokens with uneven splits — sends no padding but needs two collectives
and data-dependent shapes; fixed slots keep every shape static and the bytes predictable
(``dispatch_bytes``), at the price of the padding the chapter measures.

Ranks: the ep and edp groups split the data-parallel axis (``zero_ref.parallel.topology``: ep groups are
blocks of ep consecutive data-parallel ranks that together hold every expert once; edp groups
join the ranks that hold the same experts). Every rank sees different data, so dense parameters
are averaged over the dp group and expert parameters over their edp group — both divided by the
dp size, because an expert's gradient already sums the tokens its ep peers sent it (DeepSpeed
divides by the dp size too).

    pg = build_groups(Topology.for_world(world, ep=2), axes=("dp", "ep", "edp"))
    model = moe_gpt(cfg, num_experts=4, k=2, ep_group=pg.ep)
    ...; loss.backward(); reduce_gradients(model, pg.edp, pg.dp); opt.step()
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from zero_ref import comm
from zero_ref.models.gpt import GPT, MLP, GPTConfig
from zero_ref.parallel.capacity import capacity, dispatch_bytes  # noqa: F401  (torch-free: sim prices them too)
from zero_ref.parallel.mappings import all_to_all  # differentiable: the backward sends gradients back


# ------------------------------------------------------------------ gating

@dataclass
class Routing:
    """Where each of N tokens goes: ``expert``, ``slot`` (its row in that expert's buffer) and
    ``weight`` per choice, all (N, k); ``kept`` is False for a choice dropped at capacity."""

    expert: torch.Tensor
    slot: torch.Tensor
    weight: torch.Tensor
    kept: torch.Tensor
    capacity: int
    aux_loss: torch.Tensor

    @property
    def dropped(self) -> int:
        """Token-choices that found their expert full."""
        return int((~self.kept).sum())

    def tokens_per_expert(self, num_experts: int) -> list[int]:
        """Rows each expert receives from this rank (kept choices only)."""
        return torch.bincount(self.expert[self.kept], minlength=num_experts).tolist()


def top_k_gating(logits: torch.Tensor, k: int, capacity_factor: float, min_capacity: int = 0) -> Routing:
    """Route N tokens from their router logits (N, E).

    Weights: k = 1 keeps the softmax probability (Switch); k > 1 renormalises the kept choices'
    probabilities to sum to 1 (GShard, DeepSpeed's top-2). The auxiliary loss is
    E · Σ_e f_e · P_e, f_e the share of tokens whose first choice is e, P_e the mean router
    probability of e: 1 when both are uniform, up to E when everything goes to one expert.
    """
    n, e = logits.shape
    if not 1 <= k <= e:
        raise ValueError(f"top-k: k must be in [1, num_experts={e}], got {k}")
    probs = F.softmax(logits.float(), dim=-1)
    top_p, top_e = probs.topk(k, dim=-1)                                     # (N, k)
    c = capacity(n, e, k, capacity_factor, min_capacity)
    # Position of each choice in its expert's queue: all first choices (token order), then all
    # second choices, ... — a running count over the (k·N, E) one-hot matrix.
    onehot = F.one_hot(top_e.t().reshape(-1), e)                             # (k·N, E), choice-major
    position = ((onehot.cumsum(0) - 1) * onehot).sum(-1).view(k, n).t()       # (N, k)
    kept = position < c
    weight = top_p * kept
    if k > 1:
        weight = weight / weight.sum(-1, keepdim=True).clamp_min(torch.finfo(weight.dtype).eps)
    first = F.one_hot(top_e[:, 0], e).float()
    aux = e * (probs.mean(0) * first.mean(0)).sum()
    return Routing(top_e, top_e * c + position, weight, kept, c, aux)


# ------------------------------------------------------------------ the layer

class MoE(nn.Module):
    """A drop-in for the course GPT's MLP: a router plus ``num_experts`` MLP experts.

    With ``ep_group`` None the layer holds every expert (the single-process reference). With an
    expert-parallel group of size ep it holds experts [r·E/ep, (r+1)·E/ep) of ep-rank r, under the
    same names (``experts.<global index>``), so its state dict is a slice of the full layer's.
    Forward: gate → scatter tokens into (E, C, d) slots → all-to-all → local experts →
    all-to-all back → weighted sum into each token's row. Backward runs the two all-to-alls in
    reverse through autograd. After forward, ``aux_loss`` and ``routing`` describe this call.
    """

    def __init__(self, cfg: GPTConfig, num_experts: int, k: int = 1, capacity_factor: float = 1.25,
                 min_capacity: int = 0, ep_group=None):
        super().__init__()
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
            raise ValueError(f"num_experts must be a positive integer, got {num_experts!r}")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= num_experts:
            raise ValueError(f"top-k: k must be an integer in [1, num_experts={num_experts}], got {k!r}")
        if not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}")
        self.ep = dist.get_world_size(ep_group) if ep_group is not None else 1
        self.ep_rank = dist.get_rank(ep_group) if ep_group is not None else 0
        if num_experts % self.ep:
            raise ValueError(f"num_experts={num_experts} is not divisible by the expert-parallel group size "
                             f"ep={self.ep}: every rank must hold the same number of experts")
        self.num_experts, self.k = num_experts, k
        self.capacity_factor, self.min_capacity = capacity_factor, min_capacity
        self.ep_group, self.local = ep_group, num_experts // self.ep
        self.gate = nn.Linear(cfg.d_model, num_experts, bias=False)
        first = self.ep_rank * self.local
        self.experts = nn.ModuleDict({str(e): MLP(cfg) for e in range(first, first + self.local)})
        self.aux_loss: torch.Tensor | None = None
        self.routing: Routing | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, d = x.shape, x.shape[-1]
        tokens = x.reshape(-1, d)
        r = top_k_gating(self.gate(tokens), self.k, self.capacity_factor, self.min_capacity)
        self.routing, self.aux_loss = r, r.aux_loss
        e, c = self.num_experts, r.capacity
        src = torch.arange(tokens.shape[0], device=x.device).unsqueeze(1).expand_as(r.slot)[r.kept]
        slots = r.slot[r.kept]
        buffer = tokens.new_zeros(e * c, d).index_copy(0, slots, tokens[src])   # padded (E·C, d)
        if self.ep > 1:
            buffer = all_to_all(buffer, self.ep_group)   # now: ep chunks of (local, C, d), one per source rank
        # (ep, local, C, d) -> each local expert's rows from every source rank, in source order
        rows = buffer.view(self.ep, self.local, c, d).transpose(0, 1).reshape(self.local, self.ep * c, d)
        out = torch.stack([self.experts[str(self.ep_rank * self.local + j)](rows[j]) for j in range(self.local)])
        out = out.view(self.local, self.ep, c, d).transpose(0, 1).reshape(e * c, d)
        if self.ep > 1:
            out = all_to_all(out, self.ep_group)          # rows back to the ranks their tokens came from
        picked = out[slots] * r.weight[r.kept].unsqueeze(-1).to(out.dtype)
        return tokens.new_zeros(tokens.shape).index_add(0, src, picked).view(shape)


# ------------------------------------------------------------------ the model and its gradients

def moe_gpt(cfg: GPTConfig, num_experts: int, k: int = 1, capacity_factor: float = 1.25, *,
            every: int = 1, min_capacity: int = 0, ep_group=None) -> GPT:
    """The course GPT with the MLP of every ``every``-th block (blocks every-1, 2·every-1, ...) an MoE.

    Dropout must be 0 (a dropped-out expert row would differ between the parallel and reference runs)."""
    if cfg.dropout:
        raise ValueError(f"moe_gpt needs cfg.dropout == 0, got {cfg.dropout}")
    model = GPT(cfg)
    for i, block in enumerate(model.blocks):
        if (i + 1) % every == 0:
            block.mlp = MoE(cfg, num_experts, k, capacity_factor, min_capacity, ep_group)
            block.mlp.apply(GPT._init_weights)
    return model


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def aux_loss(model: nn.Module) -> torch.Tensor:
    """Sum of the MoE layers' load-balancing losses from the last forward (add coef × this to the loss)."""
    layers = moe_layers(model)
    if not layers or any(m.aux_loss is None for m in layers):
        raise ValueError("aux_loss: run a forward through a model with MoE layers first")
    return sum(m.aux_loss for m in layers)


def split_params(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(dense, expert) trainable parameters; expert ones live in an MoE layer's ``experts``."""
    expert_ids = {id(p) for m in moe_layers(model) for p in m.experts.parameters()}
    dense, expert, seen = [], [], set()
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            (expert if id(p) in expert_ids else dense).append(p)
    return dense, expert


def reduce_gradients(model: nn.Module, edp_group, dp_group=None) -> None:
    """Average gradients: dense ones over ``dp_group`` (all ranks), expert ones over ``edp_group``
    (required: None would mean every rank, which is right only when ep = 1).

    One flat all-reduce per kind; both divide by the dp size, the number of data shards (see the
    module docstring). An edp group of one rank (ep = world) needs no collective."""
    world = dist.get_world_size(dp_group)
    for params, group in zip(split_params(model), (dp_group, edp_group)):
        if not params:
            continue
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        if dist.get_world_size(group) > 1:
            comm.all_reduce(flat, group=group)
        flat.div_(world)
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad = g.view_as(p).clone()
