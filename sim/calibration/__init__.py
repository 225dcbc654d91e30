"""The simulator against measurements: published runs, the fit of the cost constants, local runs.

Where ``Costs``'s defaults come from. The eight constants the published runs can tell apart are
``calibrate``'s fit, so a plain ``sim.simulate(model, cluster, plan)`` runs at the
simulator's best estimate: ``efficiency`` (A100 GEMMs, 0.70) and ``nvlink_efficiency`` =
``ib_efficiency`` (0.58) solved on Korthikanti et al.'s 22B and 175B rows, ``zero3_efficiency``
(0.21) on Narayanan et al.'s ZeRO-3 175B on 768 GPUs, and ``efficiency_by_gpu`` for the V100
(0.38, Shoeybi et al.'s single-V100 1.2B) and the H100 and H200 (0.70, Llama 3 405B on 8,192
H100s; the H200 is the same SXM5 die and clocks, its faster HBM timed through ``GPU.hbm_bw``);
``attention_efficiency`` (0.17, FlashAttention's causal kernels) and ``eager_traffic`` (3.1,
PyTorch's unfused element-wise kernels) on llm-foundry's MPT-7B at 32k and MPT-1B at 2k tokens on 8 H100s;
``fp8_efficiency`` (0.65 of the FP8 peak) on NeMo's FP8 Llama 2 7B on 8 H100s.
``calibrate.validate`` reports the rows they were not fitted on (``python -m sim.calibration.validation``):
34 A100/V100 rows at 6.1 % mean absolute error on step time, 95 H100 rows (llm-foundry's,
torchtitan's and NeMo's published tables, Llama 3, Nemotron-4) at 4.8 %, none beyond 18 %.
Every other default (HBM, PCIe and NVMe efficiency,
the latencies, the CPU Adam rate) is a plausible guess that no published row we use can tell
apart; ``calibrate.sensitivity`` shows what the element-wise byte count does to the fit.

ZeRO-3's data-parallel collectives across nodes (the parameter all-gathers and the gradient
reduce-scatters of a stage-3 plan over InfiniBand) reach only ``zero3_efficiency`` of that
bandwidth; inside a node (NVLink) they run as any other collective. Narayanan et al.'s ZeRO-3 runs
(Table 2: DeepSpeed 2021 on Selene, 384 to 2240 A100s) move each GPU's 3 × 2Ψ bytes per step at
about one HDR NIC's 25 GB/s, not at the ≈ 190 GB/s bus bandwidth NCCL's rings reach over a
DGX A100's eight NICs (their 175B step stays at 66.7 s from 768 to 1536 GPUs while the compute
per GPU halves). That is DeepSpeed's implementation of the time, not the network: its gathers ran
per parameter from Python hooks through ``torch.distributed.all_gather`` into per-rank tensors
(a flatten-and-copy around every gather; DeepSpeed issue #1069 and PR #1170, 2021), on one stream
with the reduce-scatters. ``calibrate`` fits the constant on one Table 2 row and predicts the
other five (sim.step.lowering models the other half of the cause: the backward's gathers are not prefetched).

ASTRA-sim measured 741 of 900 GB/s on H100 NVLink (≈ 0.8 link efficiency); the fitted 0.58 also
carries what the rows cannot separate from it (calibrate's identifiability note).
"""
