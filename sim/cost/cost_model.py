"""How long work takes on one (cluster, plan): FLOPs → seconds on a roofline, bytes → seconds over
the right link (the α-β formulas of sim.cost.collectives).

With context parallelism the world is tp × cp × pp × dp, cp next to tp (Megatron's order,
rank = t + tp·(c + cp·(d + dp·p))): the "cp" group is cp ranks tp apart, and the "dp" group is the
dp·cp ranks that hold the same parameters, over which gradients are reduced and ZeRO shards
(DeepSpeed's ``seq_data_parallel_group``: deepspeed/utils/groups.py,
``_get_sequence_data_parallel_group``, used by engine.py ``_configure_zero_optimizer``).

DeepSpeed ZeRO-3's data-parallel collectives across nodes reach only ``Costs.zero3_efficiency`` of
the link's bandwidth (its per-parameter gathers; sim.calibration explains the constant); inside a
node they run as any other collective, and so do FSDP2's everywhere (one flat all-gather per unit).
"""
from __future__ import annotations

from zero_ref.memory import recipe
from sim.cost.collectives import point_to_point, reduce_scatter, ring_all_reduce, tree_all_reduce
from sim.cost.costs import Costs
from sim.cost.work import Adam, Collective, Compute, Copy

FP8_GPUS = ("H100-80GB", "H200-141GB")  # Hopper: dense FP8 at twice the 16-bit rate
from sim.spec.topology import Link, group_link, group_ranks, p2p_link


def link_terms(link: Link, costs: Costs) -> tuple[int, float, float]:
    """(group size n, α, effective bandwidth B) of a group's link under ``costs``."""
    if link.kind == "nvlink":
        return link.size, costs.alpha_nvlink, link.bandwidth * costs.nvlink_efficiency
    return link.size, costs.alpha_ib, link.bandwidth * costs.ib_efficiency


class CostModel:
    """Seconds of work items (sim.cost.work) for one (cluster, plan, costs): the links are resolved once."""

    def __init__(self, cluster, plan, costs: Costs | None = None):
        self.cluster, self.plan, self.costs = cluster, plan, costs or Costs()
        c, tp, dp, pp, cp = self.costs, plan.tp, plan.dp * plan.cp, plan.pp, plan.cp  # dp: the dp·cp group
        self.links: dict[str, Link] = {axis: group_link(group_ranks(axis, tp, dp, pp), cluster)
                                       for axis in ("tp", "dp", "world")}
        self.links["cp"] = group_link([k * tp for k in range(cp)], cluster)
        self.links["pp"] = p2p_link(tp, dp, cluster) if pp > 1 else Link("nvlink", cluster.nvlink_bw, 1, 1)
        for axis in ("dp_shard", "dp_replica"):  # HSDP's two levels (FSDP2 with dp_shard)
            self.links[axis] = group_link(group_ranks(axis, tp, dp, pp, shard=plan.shard_group), cluster)
        for axis in ("dp_hpz", "dp_hpz_across"):  # ZeRO++'s sub-groups (sim.step.zeropp)
            self.links[axis] = group_link(group_ranks(axis, tp, dp, pp, shard=plan.hpz), cluster)
        r = recipe(plan.precision)
        self.adam_bytes = c.adam_bytes_per_param or (2 * r.K + r.bytes_per_param("grads")
                                                    + r.bytes_per_param("params"))
        self.flops_rate = cluster.gpu.peak_flops * dict(c.efficiency_by_gpu).get(cluster.gpu.name, c.efficiency)
        if getattr(plan, "fp8", False):  # FP8 tensor cores: twice the 16-bit peak, at their own share of it
            if cluster.gpu.name not in FP8_GPUS:
                raise ValueError(f"Plan.fp8 needs a GPU with FP8 tensor cores ({', '.join(FP8_GPUS)}), "
                                 f"got {cluster.gpu.name}; use fp8=False")
            self.flops_rate = 2 * cluster.gpu.peak_flops * c.fp8_efficiency
        self.eager = getattr(plan, "kernels", "fused") == "eager"

    def link_params(self, axis: str) -> tuple[int, float, float]:
        """(group size n, α, effective bandwidth B) of the ``axis`` group's link."""
        return link_terms(self.links[axis], self.costs)

    def gather_params(self, axis: str) -> tuple[int, float, float]:
        """``link_params`` for an all-gather or reduce-scatter: over DP in a ZeRO-3 plan, across
        nodes, at ``zero3_efficiency`` of the bandwidth (see the module docstring; DeepSpeed's only)."""
        n, a, bw = self.link_params(axis)
        if (axis in ("dp", "dp_hpz", "dp_hpz_across") and self.plan.zero_stage == 3 and self.links[axis].kind == "ib"
                and self.plan.framework != "fsdp2"):
            bw *= self.costs.zero3_efficiency
        return n, a, bw

    def all_reduce(self, size: float, axis: str) -> tuple[float, str]:
        """(seconds, 'ring' | 'tree'), whichever is cheaper."""
        n, a, bw = self.link_params(axis)
        ring = ring_all_reduce(size, n, a, bw)
        tree = tree_all_reduce(size, n, a, bw * self.costs.tree_bw_efficiency)
        return (tree, "tree") if tree < ring else (ring, "ring")

    def duration(self, work: Compute | Collective | Copy | Adam) -> float:
        c, cl = self.costs, self.cluster
        if isinstance(work, Compute):
            t = work.flops / self.flops_rate
            if work.attention_flops:  # FlashAttention's kernels reach their own share of peak
                t += work.attention_flops / (cl.gpu.peak_flops * c.attention_efficiency)
            if work.hbm_bytes:  # memory-bound element-wise kernels; unfused (eager) ones move more
                t += work.hbm_bytes * c.elementwise_traffic * (c.eager_traffic if self.eager else 1.0) / (
                    cl.gpu.hbm_bw * c.hbm_efficiency)
            return t
        if isinstance(work, Collective):
            return work.count * self.collective(work.op, work.nbytes, work.axis)
        if isinstance(work, Copy):
            return self.copy(work.link, work.nbytes)
        if isinstance(work, Adam):
            if work.on == "gpu":
                return work.params * self.adam_bytes / (cl.gpu.hbm_bw * c.hbm_efficiency)
            return work.params / (c.cpu_adam_rate / cl.gpus_per_node)
        raise TypeError(f"not a work item: {work!r}")

    def collective(self, op: str, nbytes: float, axis: str) -> float:
        """Seconds of one collective ``op`` on ``nbytes`` over the ``axis`` group."""
        if op == "all_reduce":
            return self.all_reduce(nbytes, axis)[0]
        if op == "p2p":  # to the next pipeline stage, or the next rank of the cp ring
            _, a, bw = self.link_params(axis)
            return point_to_point(nbytes, a, bw)
        return reduce_scatter(nbytes, *self.gather_params(axis))  # all-gather and all-to-all cost the same

    def copy(self, link: str, nbytes: float) -> float:
        """Seconds to move ``nbytes`` host ↔ device (PCIe) or to/from this GPU's share of the node's NVMe."""
        c, cl = self.costs, self.cluster
        if link in ("h2d", "d2h"):
            return point_to_point(nbytes, c.alpha_pcie, cl.pcie_bw * c.pcie_efficiency)
        node_bw = cl.nvme_read_bw if link == "nvme_read" else cl.nvme_write_bw
        return point_to_point(nbytes, c.alpha_nvme, node_bw / cl.gpus_per_node * c.nvme_efficiency)

    def durations(self, works: list) -> list[float]:
        return [self.duration(w) for w in works]
