"""``Costs``: every constant of the cost model, with the calibrated defaults."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace


# The defaults of the eight constants sim.calibration.calibrate fits, one published row each (sim.calibration
# says where from; tests/sim/test_published.py checks that a fit from scratch returns these values):
EFFICIENCY = 0.702566        # A100 GEMMs: Korthikanti et al. 2022, Table 5, 22B and 175B (with LINK_EFFICIENCY)
LINK_EFFICIENCY = 0.581094   # NVLink and InfiniBand collectives: the same two rows
ZERO3_EFFICIENCY = 0.207019  # ZeRO-3's cross-node gathers: Narayanan et al. 2021, Table 2, 175B on 768 GPUs
V100_EFFICIENCY = 0.384129   # V100 GEMMs: Shoeybi et al. 2019, 1.2B on one V100 (39 TFLOP/s)
H100_EFFICIENCY = 0.688542    # H100 and H200 GEMMs: Llama 3 405B on 8,192 H100s (arXiv 2407.21783, Table 4)
ATTENTION_EFFICIENCY = 0.194471  # FlashAttention's causal kernels: llm-foundry's MPT-7B at 32k tokens on 8 H100s
FP8_EFFICIENCY = 0.609207      # H100 FP8 GEMMs (share of 2 × 989 TFLOP/s): NeMo 24.07, Llama 2 7B on 8 H100s
EAGER_TRAFFIC = 3.0296        # unfused (eager PyTorch) element-wise kernels: llm-foundry's MPT-1B at 2k on 8 H100s


@dataclass(frozen=True)
class Costs:
    """Every constant of the cost model (sim.calibration says where the defaults come from).

    ``efficiency``: achieved share of peak dense FLOP/s for GEMMs; ``efficiency_by_gpu``: (GPU preset
    name, GEMM efficiency) pairs for GPUs measured apart from it (``()``: one ``efficiency`` for all).
    ``elementwise_traffic`` scales the bytes ``layer_elementwise_bytes`` counts for the memory-bound
    kernels, timed at ``hbm_efficiency`` × the GPU's bandwidth. ``*_efficiency`` scale a link's raw
    bandwidth to what NCCL or a copy engine achieves; ``zero3_efficiency`` is the share of it ZeRO-3's
    data-parallel gathers and reduce-scatters across nodes reach (1 = as fast as any collective).
    ``attention_efficiency``: share of peak FlashAttention's kernels reach on the FLOPs they run
    (sim.cost.flops.layer_flops). ``eager_traffic``: how many times the counted element-wise bytes
    a plan with ``kernels='eager'`` moves (one kernel per PyTorch op: every intermediate written and
    read again, where Megatron's fused kernels and torch.compile move each tensor once).
    ``fp8_efficiency``: share of the FP8 peak (twice the 16-bit one on Hopper) a plan's GEMMs reach
    with ``fp8=True``. ``alpha_*``: per-step latency in seconds. ``cpu_adam_rate``: parameters per second CPU Adam
    updates on one node (shared by its GPUs). ``adam_bytes_per_param``: HBM bytes the GPU optimizer
    reads + writes per parameter (None: 2·K + grad + param bytes).
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
    attention_efficiency: float = ATTENTION_EFFICIENCY
    eager_traffic: float = EAGER_TRAFFIC
    fp8_efficiency: float = FP8_EFFICIENCY
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
                   alpha_pcie=0.0, alpha_nvme=0.0, cpu_adam_rate=inf, zero3_efficiency=inf,
                   attention_efficiency=efficiency, eager_traffic=1.0, fp8_efficiency=efficiency)

    def override(self, **kw) -> "Costs":
        return replace(self, **kw)
