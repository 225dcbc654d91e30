"""Mixture of Experts in the simulator: expert parallelism, all-to-all, capacity, expert-data-parallel ZeRO.

    moe = sim.cost.moe.MoE(num_experts=64, k=2, capacity_factor=1.25, ep=8, every=2)
    cost = sim.cost.moe.moe_cost(model, cluster, plan, moe)
    cost.dispatch_bytes, cost.all_to_all["forward"], cost.states_bytes, cost.grad_sync

Every ``every``-th layer's MLP becomes ``num_experts`` copies of itself behind a top-k gate. The
ep ranks of an expert-parallel group hold num_experts/ep experts each; they are blocks of ep
consecutive data-parallel ranks (``zero_ref.parallel.topology``), so the ep group of rank 0 is
[0, tp, ..., (ep − 1)·tp] and its link is NVLink while tp·ep ≤ GPUs per node.

Per MoE layer and micro-batch, one rank (as zero_ref's layer does it, fixed capacity slots):
    capacity  C = ceil(k · b·s · capacity_factor / E)               (``zero_ref.parallel.capacity``)
    dispatch and combine in forward, their transposes in backward: four all-to-alls of the padded
    (E, C, h) buffer, E·C·h·e bytes each, (ep − 1)/ep of it leaving the rank (nothing overlaps them):
        inside a node   (ep − 1)·α + (ep − 1)/ep · S/B_nvlink
        across nodes    (ep − 1)·α + max((ep − g)/ep · S/B_ib, (g − 1)/ep · S/B_nvlink)
    with g the group's ranks per node. Across nodes every rank of a node sends at once, so each gets
    only its own NIC, ib_bw/gpus_per_node (the bisection bound), not the g NICs a ring would use.
Memory and gradients, per rank: the dense parameters are replicated over dp and partitioned by ZeRO
over dp; an expert's parameters are replicated over the edp = dp/ep ranks that hold it, and ZeRO
partitions them over that expert-data-parallel group (DeepSpeed's ``expert_data_parallel_group``).
Each gradient sync is a ring all-reduce (stage 0/1) or reduce-scatter (stage 2/3) over its group.

Tensor parallelism: experts are not split over tp here (tp must be 1 with MoE), as in DeepSpeed's
MoE without expert-tensor parallelism. ``sim.simulate`` does not schedule MoE layers; this module
prices them beside a simulated dense step.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.cost.collectives import reduce_scatter, ring_all_reduce
from sim.cost.cost_model import CostModel, link_terms
from sim.cost.costs import Costs
from sim.spec.checks import positive_int, positive_number
from sim.spec.topology import Link, group_link
from zero_ref.memory import model_state_bytes, recipe
from zero_ref.parallel.capacity import capacity, dispatch_bytes
from zero_ref.parallel.topology import Topology


@dataclass(frozen=True)
class MoE:
    """``num_experts`` experts behind a top-``k`` gate in every ``every``-th layer, ``ep``-way expert parallel."""

    num_experts: int
    k: int = 1
    capacity_factor: float = 1.25
    ep: int = 1
    every: int = 1
    min_capacity: int = 0

    def __post_init__(self):
        for f in ("num_experts", "k", "ep", "every"):
            positive_int("MoE", f, getattr(self, f))
        positive_number("MoE", "capacity_factor", self.capacity_factor)
        if self.k > self.num_experts:
            raise ValueError(f"MoE.k = {self.k} must be at most MoE.num_experts = {self.num_experts}")
        if self.num_experts % self.ep:
            raise ValueError(f"MoE.num_experts = {self.num_experts} is not divisible by MoE.ep = {self.ep}: "
                             "every rank must hold the same number of experts")

    def layers(self, model) -> int:
        """How many of the model's layers hold experts: layers every-1, 2·every-1, ..."""
        return model.layers // self.every


def expert_params(model) -> int:
    """Parameters of one expert: the model's MLP (2 or 3 matrices h × f, and biases when the model has them)."""
    h, f = model.hidden, model.ffn_hidden
    matrices = 3 if model.gated else 2
    return matrices * h * f + (((matrices - 1) * f + h) if model.bias else 0)


def all_to_all_time(size: float, link: Link, cluster, costs: Costs) -> float:
    """Seconds of one all-to-all of a ``size``-byte buffer per rank over ``link`` (see the module docstring)."""
    n = link.size
    if n == 1:
        return 0.0
    if link.kind == "nvlink":
        return (n - 1) * costs.alpha_nvlink + (n - 1) / n * size / (cluster.nvlink_bw * costs.nvlink_efficiency)
    g = link.per_node
    across = (n - g) / n * size / (cluster.ib_bw_per_gpu * costs.ib_efficiency)
    inside = (g - 1) / n * size / (cluster.nvlink_bw * costs.nvlink_efficiency)
    return (n - 1) * costs.alpha_ib + max(across, inside)


@dataclass(frozen=True)
class MoECost:
    """One rank of an MoE plan: the all-to-all per MoE layer and micro-batch, and the step's states and syncs.

    ``all_to_all``: {'forward', 'backward'} seconds per MoE layer (two all-to-alls each). ``grad_sync``:
    {'dense', 'expert'} seconds per step. ``params``: {'dense', 'expert'} parameters the rank holds
    before ZeRO (expert: its num_experts/ep experts in every MoE layer)."""

    capacity: int
    dispatch_bytes: int
    link: Link
    all_to_all: dict
    params: dict
    states_bytes: float
    grad_sync: dict


def moe_cost(model, cluster, plan, moe: MoE, costs: Costs | None = None) -> MoECost:
    """What ``moe`` costs one rank of ``model`` trained with ``plan`` on ``cluster``."""
    if plan.tp != 1:
        raise ValueError(f"sim.cost.moe models experts without tensor parallelism: Plan.tp must be 1, got {plan.tp}")
    if plan.dp % moe.ep:
        raise ValueError(f"MoE.ep = {moe.ep} must divide Plan.dp = {plan.dp} (expert groups split the data-parallel ranks)")
    cm = CostModel(cluster, plan, costs)
    c, e = cm.costs, recipe(plan.precision).bytes_per_param("params")
    topo = Topology(tp=plan.tp, dp=plan.dp, pp=plan.pp, ep=moe.ep)
    link = group_link(topo.group_of("ep", 0), cluster)
    slots = capacity(plan.micro_batch_size * model.seq, moe.num_experts, moe.k, moe.capacity_factor,
                     moe.min_capacity)
    size = dispatch_bytes(moe.num_experts, slots, model.hidden, e)
    one = all_to_all_time(size, link, cluster, c)
    n_moe = moe.layers(model)
    gate = model.hidden * moe.num_experts                    # the router: h × E, no bias
    dense = (model.num_params + n_moe * (gate - expert_params(model))) // plan.pp
    expert = n_moe * moe.num_experts // moe.ep * expert_params(model) // plan.pp
    edp = plan.dp // moe.ep
    states = (model_state_bytes(dense, zero_stage=plan.zero_stage, dp=plan.dp, precision=plan.precision).total
              + model_state_bytes(expert, zero_stage=plan.zero_stage, dp=edp, precision=plan.precision).total)
    g = recipe(plan.precision).bytes_per_param("grads")

    def sync(params: int, n: int, axis_ranks: list[int]) -> float:
        _, a, b = link_terms(group_link(axis_ranks, cluster), c)
        return (reduce_scatter(params * g, n, a, b) if plan.zero_stage >= 2 else ring_all_reduce(params * g, n, a, b))

    grad_sync = {"dense": sync(dense, plan.dp, topo.group_of("dp", 0)),
                 "expert": sync(expert, edp, topo.group_of("edp", 0))}
    return MoECost(slots, size, link, {"forward": 2 * one, "backward": 2 * one},
                   {"dense": dense, "expert": expert}, states, grad_sync)

