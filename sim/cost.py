"""How long things take: FLOPs → seconds, bytes → seconds over the right link (alpha-beta model).

Compute, a roofline summed over a layer's kernels: t = FLOPs / (peak × efficiency) for the GEMMs
plus bytes / (HBM bandwidth × hbm_efficiency) for the memory-bound element-wise kernels (LayerNorm,
dropout, GeLU, softmax, residual adds), which barely compute but move every activation
(``layer_elementwise_bytes`` counts them). A transformer layer's forward on b sequences of s
tokens costs 2·b·s·(4h² + k·h·f) + 4·b·s²·h FLOPs (k = 2 MLP matrices, 3 if gated), which is
24bsh² + 4bs²h for the GPT MLP f = 4h; backward costs twice the forward; full recomputation adds
a forward, selective recomputation the attention core 4bs²h (and its softmax and dropout). The
element-wise share of a layer's time falls as 1/h and as h/(a·s) (the attention scores): this is
what makes a small model's compute less efficient than a large one's at the same GEMM efficiency.

Collectives of S bytes over n ranks on a link of bandwidth B (after efficiency) and latency α:

    ring all-reduce          2(n−1)α + 2(n−1)/n · S/B
    tree all-reduce          2⌈log2 n⌉α + 2(n−1)/n · S/B   (bandwidth × tree_bw_efficiency)
    reduce-scatter / gather  (n−1)α + (n−1)/n · S/B        (S = the full, unsharded buffer)
    point-to-point           α + S/B

``all_reduce`` takes the cheaper of ring and tree, as NCCL's tuner does. With equal bandwidth
terms the tree never loses (⌈log2 n⌉ ≤ n − 1); calibrating ``tree_bw_efficiency`` below 1 makes the
ring win for large messages. Every constant lives in ``Costs`` and can be overridden.

ZeRO-3's data-parallel collectives across nodes (the parameter all-gathers and the gradient
reduce-scatters of a stage-3 plan over InfiniBand) reach only ``zero3_efficiency`` of that
bandwidth; inside a node (NVLink) they run as any other collective. Narayanan et al.'s ZeRO-3 runs
(Table 2: DeepSpeed 2021 on Selene, 384 to 2240 A100s) move each GPU's 3 × 2Ψ bytes per step at
about one HDR NIC's 25 GB/s, not at the ≈ 190 GB/s bus bandwidth NCCL's rings reach over a
DGX A100's eight NICs (their 175B step stays at 66.7 s from 768 to 1536 GPUs while the compute
per GPU halves). That is DeepSpeed's implementation of the time, not the network: its gathers ran
per parameter from Python hooks through ``torch.distributed.all_gather`` into per-rank tensors
(a flatten-and-copy around every gather; DeepSpeed issue #1069 and PR #1170, 2021), on one stream
with the reduce-scatters. sim.calibrate fits the constant on one Table 2 row and predicts the
other five (sim.graph models the other half of the cause: the backward's gathers are not prefetched).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from zero_ref.memory import recipe
from sim.topology import Link, group_link, group_ranks, p2p_link

# ---------------------------------------------------------------- FLOPs


def layer_forward_flops(model, batch: int) -> float:
    """Forward FLOPs of one transformer layer on ``batch`` sequences: 2bs(2h² + 2h·h_kv + k·h·f) + 4bs²h.

    h_kv = kv_heads × head dimension is the k and v projections' width (h for multi-head
    attention, which gives 2bs(4h² + k·h·f)); the attention core 4bs²h is the same with grouped
    keys and values (every query head still attends over all s positions)."""
    b, s, h, f = batch, model.seq, model.hidden, model.ffn_hidden
    kv = getattr(model, "kv_width", h)
    return 2 * b * s * (2 * h * h + 2 * h * kv + (3 if model.gated else 2) * h * f) + 4 * b * s * s * h


def attention_core_flops(model, batch: int) -> float:
    """Forward FLOPs of QKᵀ and attention × V in one layer: 4bs²h (what selective recompute redoes)."""
    return 4 * batch * model.seq * model.seq * model.hidden


def layer_backward_flops(model, batch: int, recompute: str = "none", attention: str = "eager") -> float:
    """Backward FLOPs of one layer: twice the forward, plus what it recomputes.

    ``recompute`` 'full' adds a forward, 'selective' the attention core (4bs²h). FlashAttention's
    backward (``attention`` 'flash') recomputes the scores QKᵀ from Q, K and the kept log-sum-exp:
    2bs²h more, half the attention core, in every mode but 'full' (which already reruns it) and
    'selective' (which reruns the core's forward, scores included)."""
    fwd = layer_forward_flops(model, batch)
    core = attention_core_flops(model, batch)
    extra = {"none": core / 2 if attention == "flash" else 0.0, "selective": core, "full": fwd}[recompute]
    return 2 * fwd + extra


def layer_elementwise_bytes(model, batch: int, *, tp: int = 1, sp: bool = False, width: int = 1,
                            attention: str = "eager") -> dict:
    """HBM bytes one layer's memory-bound kernels move on one tensor-parallel rank, per pass.

    Counted tensor by tensor for Megatron's fused kernels (a tensor read or written once each),
    with x an s·b·h activation (split over TP only with sequence parallelism ``sp``), i the
    s·b·f MLP intermediate (two for a gated MLP) and A the a·s²·b attention scores (both split
    over TP), 16-bit (× ``width``), plus 1-byte dropout masks m:

        forward   2 LayerNorms 4x, 2 bias-dropout-adds 6x + 2m_x, bias-GeLU 2i,
                  scale-mask-softmax 2A, attention dropout 2A + m_A, score GEMMs 2A
        backward  2 bias-dropout-adds 6x + 2m_x (with the bias gradients), 2 LayerNorms 12x (with
                  the residual-gradient adds), bias-GeLU 4i, attention dropout 2A + m_A, softmax 3A,
                  score GEMMs 4A
        attention_core  what selective recomputation re-runs: QKᵀ, softmax, dropout, 5A + m_A

    The score GEMMs (QKᵀ and scores × V, head dimension 128) are memory-bound on the roofline
    (≈ 110 FLOP/byte against an A100's ≈ 190), so the scores they write and read are counted here
    as well as their FLOPs being timed (a sum where the roofline takes a max: slightly
    pessimistic). Other GEMM operands are not counted. A model without dropout has no masks
    (m_x, m_A) and no attention dropout (2A each way). ``attention`` 'flash' keeps the scores in
    on-chip memory: no A term at all. Returns {'forward', 'backward', 'attention_core'};
    ``Costs.elementwise_traffic`` scales them.
    """
    s, b, h, a, t = model.seq, batch, model.hidden, model.heads, tp
    e = 2 * width                                   # bytes per activation element
    x_el = s * b * h / (t if sp else 1)             # LayerNorm / dropout / residual tensors
    i_el = s * b * model.ffn_hidden * (2 if model.gated else 1) / t
    a_el = 0.0 if attention == "flash" else a * s * s * b / t
    x, i, A = e * x_el, e * i_el, e * a_el
    drop = getattr(model, "dropout", True)
    mx, mA, dA = (2 * x_el, a_el, 2 * A) if drop else (0.0, 0.0, 0.0)  # masks, attention dropout
    return {"forward": 10 * x + mx + 2 * i + 4 * A + dA + mA,
            "backward": 18 * x + mx + 4 * i + 7 * A + dA + mA,
            "attention_core": 3 * A + dA + mA}


def head_forward_flops(model, batch: int) -> float:
    """Forward FLOPs of the output projection to the vocabulary: 2bshV."""
    return 2 * batch * model.seq * model.hidden * model.vocab


def model_flops_per_step(model, global_batch: int, *, head: bool = True) -> float:
    """Model FLOPs of one step (forward + backward = 3 × forward; recomputation not counted)."""
    fwd = model.layers * layer_forward_flops(model, 1) + (head_forward_flops(model, 1) if head else 0)
    return 3 * global_batch * fwd


# ---------------------------------------------------------------- collectives (pure formulas)


def ring_all_reduce(size: float, n: int, alpha: float, bw: float) -> float:
    return 0.0 if n == 1 else 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bw


def tree_all_reduce(size: float, n: int, alpha: float, bw: float) -> float:
    return 0.0 if n == 1 else 2 * math.ceil(math.log2(n)) * alpha + 2 * (n - 1) / n * size / bw


def reduce_scatter(size: float, n: int, alpha: float, bw: float) -> float:
    return 0.0 if n == 1 else (n - 1) * alpha + (n - 1) / n * size / bw


all_gather = reduce_scatter  # same cost: (n−1)α + (n−1)/n · S/B


def point_to_point(size: float, alpha: float, bw: float) -> float:
    return alpha + size / bw


# ---------------------------------------------------------------- constants


# The defaults of the five constants sim.calibrate fits, one published row each (its module
# docstring; tests/test_sim_published.py checks that a fit from scratch returns these values):
EFFICIENCY = 0.702566        # A100 GEMMs: Korthikanti et al. 2022, Table 5, 22B and 175B (with LINK_EFFICIENCY)
LINK_EFFICIENCY = 0.581094   # NVLink and InfiniBand collectives: the same two rows
ZERO3_EFFICIENCY = 0.207019  # ZeRO-3's cross-node gathers: Narayanan et al. 2021, Table 2, 175B on 768 GPUs
V100_EFFICIENCY = 0.384129   # V100 GEMMs: Shoeybi et al. 2019, 1.2B on one V100 (39 TFLOP/s)
H100_EFFICIENCY = 0.64691    # H100 and H200 GEMMs: Llama 3 405B on 8,192 H100s (arXiv 2407.21783, Table 4)


@dataclass(frozen=True)
class Costs:
    """Every constant of the cost model.

    Where the defaults come from. The five constants the published runs can tell apart are
    ``sim.calibrate``'s fit, so a plain ``sim.simulate(model, cluster, plan)`` runs at the
    simulator's best estimate: ``efficiency`` (A100 GEMMs, 0.70) and ``nvlink_efficiency`` =
    ``ib_efficiency`` (0.58) solved on Korthikanti et al.'s 22B and 175B rows, ``zero3_efficiency``
    (0.21) on Narayanan et al.'s ZeRO-3 175B on 768 GPUs, and ``efficiency_by_gpu`` for the V100
    (0.38, Shoeybi et al.'s single-V100 1.2B) and the H100 and H200 (0.65, Llama 3 405B on 8,192
    H100s; the H200 is the same SXM5 die and clocks, its faster HBM timed through ``GPU.hbm_bw``).
    ``sim.calibrate.validate`` reports the rows they were not fitted on: 38 published runs at 6.1 %
    mean absolute error on step time, the H100 rows within 12 %. Every other default (HBM, PCIe and NVMe efficiency,
    the latencies, the CPU Adam rate) is a plausible guess that no published row we use can tell
    apart; ``sim.calibrate.sensitivity`` shows what the element-wise byte count does to the fit.

    ``efficiency``: achieved share of peak dense FLOP/s for GEMMs. ``elementwise_traffic`` scales
    the bytes ``layer_elementwise_bytes`` counts for the memory-bound kernels (timed at
    ``hbm_efficiency`` × the GPU's bandwidth; see the module docstring). ``*_efficiency`` scale
    a link's raw bandwidth to what NCCL or a copy engine achieves (ASTRA-sim measured 741 of
    900 GB/s on H100 NVLink, ≈ 0.8; the fitted 0.58 also carries what the rows cannot separate from
    it, see sim.calibrate's identifiability note). ``alpha_*``: per-step latency in seconds. ``cpu_adam_rate``:
    parameters per second CPU Adam updates on one node (shared by its GPUs). ``adam_bytes_per_param``:
    HBM bytes the GPU optimizer reads + writes per parameter (None: 2·K + grad + param bytes).
    ``zero3_efficiency``: the share of that collective bandwidth ZeRO-3's data-parallel gathers and
    reduce-scatters across nodes reach (see the module docstring; 1 = as fast as any other collective).
    ``efficiency_by_gpu``: (GPU preset name, GEMM efficiency) pairs for GPUs whose efficiency was
    measured apart from ``efficiency`` (a V100's software and kernels reach a smaller share of its
    peak than an A100's, an H100's a smaller share than an A100's: the fit cannot be carried across
    generations); others use ``efficiency``. Pass ``efficiency_by_gpu=()`` for one ``efficiency``
    on every GPU.
    """

    efficiency: float = EFFICIENCY
    elementwise_traffic: float = 1.0
    hbm_efficiency: float = 0.8
    nvlink_efficiency: float = LINK_EFFICIENCY
    ib_efficiency: float = LINK_EFFICIENCY
    pcie_efficiency: float = 0.8
    nvme_efficiency: float = 1.0
    tree_bw_efficiency: float = 1.0
    alpha_nvlink: float = 2e-6
    alpha_ib: float = 6e-6
    alpha_pcie: float = 10e-6
    alpha_nvme: float = 100e-6
    cpu_adam_rate: float = 2e9
    adam_bytes_per_param: float | None = None
    zero3_efficiency: float = ZERO3_EFFICIENCY
    efficiency_by_gpu: tuple = (("V100-32GB", V100_EFFICIENCY), ("H100-80GB", H100_EFFICIENCY),
                                ("H200-141GB", H100_EFFICIENCY))

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "adam_bytes_per_param" and v is None:
                continue
            if f.name == "efficiency_by_gpu":
                if not isinstance(v, tuple) or not all(
                        isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], (int, float))
                        and not isinstance(p[1], bool) and p[1] > 0 for p in v):
                    raise ValueError(f"Costs.efficiency_by_gpu must be ((gpu name, efficiency > 0), ...), got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or (
                    v == 0 and not f.name.startswith("alpha")):
                raise ValueError(f"Costs.{f.name} must be a positive number (alphas may be 0), got {v!r}")

    @classmethod
    def compute_only(cls, efficiency: float = 0.5) -> "Costs":
        """Free communication, copies, optimizer and element-wise kernels: only FLOPs take time (closed forms)."""
        inf = math.inf
        return cls(efficiency=efficiency, efficiency_by_gpu=(), hbm_efficiency=inf, nvlink_efficiency=inf, ib_efficiency=inf,
                   pcie_efficiency=inf, nvme_efficiency=inf, alpha_nvlink=0.0, alpha_ib=0.0,
                   alpha_pcie=0.0, alpha_nvme=0.0, cpu_adam_rate=inf, zero3_efficiency=inf)

    def override(self, **kw) -> "Costs":
        return replace(self, **kw)


# ---------------------------------------------------------------- the model on one cluster + plan


def link_terms(link: Link, costs: Costs) -> tuple[int, float, float]:
    """(group size n, α, effective bandwidth B) of a group's link under ``costs``."""
    if link.kind == "nvlink":
        return link.size, costs.alpha_nvlink, link.bandwidth * costs.nvlink_efficiency
    return link.size, costs.alpha_ib, link.bandwidth * costs.ib_efficiency


class CostModel:
    """Durations of work items for one (cluster, plan, costs): the links are resolved once.

    A work item is a tuple ``(op, amount, axis, count)``: op 'compute' (FLOPs; its third field
    holds the bytes of its element-wise kernels, or '' for none), 'adam' and
    'cpu_adam' (parameters), 'all_reduce' | 'reduce_scatter' | 'all_gather' (bytes over ``axis``
    'tp' | 'dp' | 'world'), 'p2p', 'h2d', 'd2h', 'nvme_read', 'nvme_write' (bytes); ``count``
    repeats it back to back.
    """

    def __init__(self, cluster, plan, costs: Costs | None = None):
        self.cluster, self.plan, self.costs = cluster, plan, costs or Costs()
        c, tp, dp, pp = self.costs, plan.tp, plan.dp, plan.pp
        self.links: dict[str, Link] = {axis: group_link(group_ranks(axis, tp, dp, pp), cluster)
                                       for axis in ("tp", "dp", "world")}
        self.links["pp"] = p2p_link(tp, dp, cluster) if pp > 1 else Link("nvlink", cluster.nvlink_bw, 1, 1)
        r = recipe(plan.precision)
        self.adam_bytes = c.adam_bytes_per_param or (2 * r.K + r.bytes_per_param("grads")
                                                    + r.bytes_per_param("params"))
        self.flops_rate = cluster.gpu.peak_flops * dict(c.efficiency_by_gpu).get(cluster.gpu.name, c.efficiency)

    def link_params(self, axis: str) -> tuple[int, float, float]:
        """(group size n, α, effective bandwidth B) of the ``axis`` group's link."""
        return link_terms(self.links[axis], self.costs)

    def gather_params(self, axis: str) -> tuple[int, float, float]:
        """``link_params`` for an all-gather or reduce-scatter: over DP in a ZeRO-3 plan, across
        nodes, at ``zero3_efficiency`` of the bandwidth (see the module docstring)."""
        n, a, bw = self.link_params(axis)
        if axis == "dp" and self.plan.zero_stage == 3 and self.links[axis].kind == "ib":
            bw *= self.costs.zero3_efficiency
        return n, a, bw

    def all_reduce(self, size: float, axis: str) -> tuple[float, str]:
        """(seconds, 'ring' | 'tree'), whichever is cheaper."""
        n, a, bw = self.link_params(axis)
        ring = ring_all_reduce(size, n, a, bw)
        tree = tree_all_reduce(size, n, a, bw * self.costs.tree_bw_efficiency)
        return (tree, "tree") if tree < ring else (ring, "ring")

    def duration(self, work: tuple) -> float:
        op, amount, axis, count = work
        c, cl = self.costs, self.cluster
        if op == "compute":
            t = amount / self.flops_rate
            if axis:  # memory-bound element-wise kernels
                t += axis * c.elementwise_traffic / (cl.gpu.hbm_bw * c.hbm_efficiency)
        elif op == "all_reduce":
            t = self.all_reduce(amount, axis)[0]
        elif op in ("reduce_scatter", "all_gather"):
            t = reduce_scatter(amount, *self.gather_params(axis))
        elif op == "p2p":
            _, a, bw = self.link_params("pp")
            t = point_to_point(amount, a, bw)
        elif op in ("h2d", "d2h"):
            t = point_to_point(amount, c.alpha_pcie, cl.pcie_bw * c.pcie_efficiency)
        elif op in ("nvme_read", "nvme_write"):
            node_bw = cl.nvme_read_bw if op == "nvme_read" else cl.nvme_write_bw
            t = point_to_point(amount, c.alpha_nvme, node_bw / cl.gpus_per_node * c.nvme_efficiency)
        elif op == "adam":
            t = amount * self.adam_bytes / (cl.gpu.hbm_bw * c.hbm_efficiency)
        elif op == "cpu_adam":
            t = amount / (c.cpu_adam_rate / cl.gpus_per_node)
        else:
            raise ValueError(f"unknown work op {op!r}")
        return count * t

    def durations(self, works: list[tuple]) -> list[float]:
        return [self.duration(w) for w in works]
