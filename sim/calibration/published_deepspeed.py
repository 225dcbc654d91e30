"""Published DeepSpeed (ZeRO) runs as data, each with its source; see sim.calibration.published for the rest.

ZERO-OFFLOAD — Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training" (arXiv
2101.06840, USENIX ATC 2021). Abstract: "ZeRO-Offload can achieve 40 TFlops/GPU on a single NVIDIA
V100 GPU for 10B parameter model". The configuration is DeepSpeed's own ZeRO-Offload tutorial
(microsoft/DeepSpeed docs/_tutorials/zero-offload.md, "Training a 10B parameter GPT-2 on 1 V100
GPU"): the Megatron-LM GPT-2 of DeepSpeedExamples with 50 layers, hidden 4096, 32 heads, batch 10,
--checkpoint-activations, ZeRO stage 2 with cpu_offload, contiguous_gradients and overlap_comm, on
one V100-SXM3 32 GB of a DGX-2. Assumed: the abstract's run is the tutorial's configuration;
sequence 1024 and GPT-2's vocabulary padded to 50304 (that code's defaults); the TFLOP/s counted
as Megatron-DeepSpeed logs them (eq. (3) of Narayanan et al., with the recomputation); the
host's CPU Adam drives one GPU (the other 15 idle).

Not simulated (their configurations are not published in text we could read): ZeRO's 100B on
400 V100s (ZeRO-2 + 16-way model parallelism, "over 38 TFlops per GPU, and aggregate performance
over 15 Petaflops", arXiv 1910.02054 §10.2 — the batch sizes are in its appendix tables, which are
images), ZeRO-3 Offload / ZeRO-Infinity's 1T on 512 V100s ("25 PetaFlops ... 49 TFlops/GPU",
DeepSpeed blog 2021-03-08; ZeRO-Infinity, arXiv 2104.07857: up to 20T on 512 V100s).
They are in ``REPORTED`` as (claim, source) pairs for the record.
"""
from __future__ import annotations

from sim.calibration.published_run import PublishedRun

ZERO_OFFLOAD = "Ren et al. 2021, arXiv 2101.06840"

# DGX-2: 16 × V100-SXM3 32 GB on NVSwitch (150 GB/s per GPU per direction), 8 × 100 Gb/s EDR
# InfiniBand per node, PCIe 3 x16 to the host, 1.5 TB of host memory.
DGX2 = (("nvlink_bw", 150e9), ("ib_bw", 100e9), ("pcie_bw", 16e9), ("cpu_bytes", 1.5e12))

DEEPSPEED = (
    PublishedRun(
        "zero-offload-10B-1gpu",
        f"{ZERO_OFFLOAD}: abstract (40 TFlops/GPU, 10B, one V100); configuration from DeepSpeed's "
        "ZeRO-Offload tutorial (50 layers, hidden 4096, 32 heads, batch 10, ZeRO-2 + cpu_offload)",
        50, 4096, 32, 1, 1, 1, 10, 10, "full", tflops_per_gpu=40, flops="hardware", seq=1024, vocab=50304,
        gpu="V100-32GB", zero_stage=2, offload_optimizer="cpu", gpus_per_node=1, node=DGX2, family="offload",
        assumptions="the abstract's run is the tutorial's configuration; sequence 1024; vocabulary 50304"),
)

REPORTED = (
    ("ZeRO-2 + 16-way MP, 100B on 400 V100s: over 38 TFLOP/s per GPU, over 15 PFLOP/s",
     "Rajbhandari et al. 2020, arXiv 1910.02054, §10.2 and Figure 2"),
    ("ZeRO-3 Offload, 1T on 512 V100s: 25 PFLOP/s, 49 TFLOP/s per GPU",
     "DeepSpeed blog 'DeepSpeed ZeRO-3 Offload', 2021-03-08"),
    ("ZeRO-Infinity: over 25 PFLOP/s on 512 V100s, up to 20T parameters; 1T on one DGX-2 node",
     "Rajbhandari et al. 2021, arXiv 2104.07857, abstract and §8 (not read in full text)"),
)
