"""What it runs on: a ``GPU`` and a ``Cluster`` of them, with presets. Bandwidths are bytes/s, one direction.

Plain frozen dataclasses that check their fields on construction. Every field can be overridden:
``Cluster.preset("A100-80GB", nodes=128, ib_bw=400e9)``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from zero_ref.memory import GiB
from sim.spec.checks import positive_int, positive_number


@dataclass(frozen=True)
class GPU:
    """One accelerator: dense 16-bit peak FLOP/s, HBM capacity (bytes) and bandwidth (bytes/s)."""

    name: str
    peak_flops: float
    hbm_bytes: float
    hbm_bw: float
    bf16: bool = True

    def __post_init__(self):
        for f in ("peak_flops", "hbm_bytes", "hbm_bw"):
            positive_number("GPU", f, getattr(self, f))

    @classmethod
    def preset(cls, name: str, **overrides) -> "GPU":
        if name not in GPUS:
            raise ValueError(f"unknown GPU preset {name!r}; choose one of: {', '.join(GPUS)}")
        return replace(GPUS[name], **overrides)


GPUS = {g.name: g for g in (
    GPU("V100-32GB", 125e12, 32 * GiB, 900e9, bf16=False),   # fp16 tensor cores; no bf16
    GPU("A100-40GB", 312e12, 40 * GiB, 1555e9),
    GPU("A100-80GB", 312e12, 80 * GiB, 2039e9),
    GPU("H100-80GB", 989e12, 80 * GiB, 3350e9),               # SXM
    GPU("H200-141GB", 989e12, 141e9, 4800e9),
)}


@dataclass(frozen=True)
class Cluster:
    """``nodes`` × ``gpus_per_node`` GPUs and the links between them (bytes/s, one direction).

    ``nvlink_bw`` per GPU inside a node (NVLink/NVSwitch); ``pcie_bw`` per GPU to its host;
    ``ib_bw`` per node across nodes (all its NICs together: each GPU's share is ib_bw/gpus_per_node);
    ``nvme_read_bw``/``nvme_write_bw`` per node; ``cpu_bytes`` host memory and ``nvme_bytes`` per node.
    """

    gpu: GPU
    nodes: int = 1
    gpus_per_node: int = 8
    nvlink_bw: float = 300e9
    pcie_bw: float = 32e9
    ib_bw: float = 200e9
    nvme_read_bw: float = 25e9
    nvme_write_bw: float = 20e9
    cpu_bytes: float = 1024 * GiB
    nvme_bytes: float = 15e12

    def __post_init__(self):
        if not isinstance(self.gpu, GPU):
            raise ValueError(f"Cluster.gpu must be a GPU, got {self.gpu!r}")
        positive_int("Cluster", "nodes", self.nodes)
        positive_int("Cluster", "gpus_per_node", self.gpus_per_node)
        for f in ("nvlink_bw", "pcie_bw", "ib_bw", "nvme_read_bw", "nvme_write_bw", "cpu_bytes", "nvme_bytes"):
            positive_number("Cluster", f, getattr(self, f))

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def ib_bw_per_gpu(self) -> float:
        return self.ib_bw / self.gpus_per_node

    @classmethod
    def preset(cls, gpu: str, nodes: int = 1, **overrides) -> "Cluster":
        """A DGX-like node of ``gpu`` (see NODES), ``nodes`` of them; any field can be overridden."""
        if gpu not in NODES:
            raise ValueError(f"unknown cluster preset {gpu!r}; choose one of: {', '.join(NODES)}")
        gpu_overrides = {k: overrides.pop(k) for k in ("peak_flops", "hbm_bytes", "hbm_bw") if k in overrides}
        return cls(GPU.preset(gpu, **gpu_overrides), nodes=nodes, **{**NODES[gpu], **overrides})


# Per-node defaults in the style of the vendor's reference node: DGX-1 (V100: 4×100 Gb/s IB, PCIe 3),
# DGX A100 (8×200 Gb/s HDR, PCIe 4), DGX H100/H200 (8×400 Gb/s NDR, PCIe 5). NVLink: per GPU, one
# direction (V100 NVLink2 150 GB/s, A100 NVLink3 300 GB/s, H100/H200 NVLink4 450 GB/s).
NODES = {
    "V100-32GB": dict(nvlink_bw=150e9, pcie_bw=16e9, ib_bw=50e9, cpu_bytes=512 * GiB),
    "A100-40GB": dict(nvlink_bw=300e9, pcie_bw=32e9, ib_bw=200e9, cpu_bytes=1024 * GiB),
    "A100-80GB": dict(nvlink_bw=300e9, pcie_bw=32e9, ib_bw=200e9, cpu_bytes=2048 * GiB),
    "H100-80GB": dict(nvlink_bw=450e9, pcie_bw=64e9, ib_bw=400e9, cpu_bytes=2048 * GiB),
    "H200-141GB": dict(nvlink_bw=450e9, pcie_bw=64e9, ib_bw=400e9, cpu_bytes=2048 * GiB),
}
