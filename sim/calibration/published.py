"""Published training runs as data (sim.calibration.published_run.PublishedRun), each with its source.

Every number below was read in the paper's text (or the run's own published log or script) and
the place is named next to the row; what a paper does not say is stated as an assumption in the
row's ``assumptions``. ``ALL`` holds every row: Megatron-LM's papers, MT-NLG and BLOOM here,
ZeRO's papers in sim.calibration.published_deepspeed, the H100 runs (Llama 3 405B, Nemotron-4 15B) in
sim.published_hopper. sim.calibration.calibrate fits on ``CALIBRATION`` and predicts the rest.

Sources
-------
KORTHIKANTI — Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (arXiv 2205.05198, MLSys 2023). Table 3 gives the configurations (sequence 2048,
vocabulary 51200, DP 1: GPUs = TP × PP), Table 5 the iteration times with full recomputation
(tensor parallelism only) and with sequence parallelism + selective recomputation ("present
work"). The interleaving degree is not in Table 3; we take it from Calculon's transcription of
the same runs (calculon-ai/calculon ``validation/*_seqsel.json`` / ``*_full.json``: 175B and 530B
interleaved with 3 chunks per stage, 22B and 1T not). The present-work MFU/HFU are the ones the
Megatron-LM README lists (22B 41.5/43.7 %, 175B 51.4/52.8 %, 530B 56.0/57.0 %, 1T 56.3/57.0 %); they
follow from Table 5's times through the paper's formulas (checked in tests/sim/test_published.py).
The arXiv v1 abstract's "530B on 2240 GPUs, MFU 54.2 % vs 42.1 %" is an earlier configuration
(DP 8), not Table 5's.

NARAYANAN — Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM" (arXiv 2104.04473, SC21). Table 1 (weak scaling, 1.7B … 1T on Selene
A100-80GB; sequence 2048, vocabulary 51200): GPUs, TP, PP, global batch and achieved TFLOP/s per
GPU, counted with eq. (3), F = 96·B·s·l·h²·(1 + s/6h + V/16lh) — the FLOPs *with* activation
recomputation. Table 1 does not give the micro-batch size, the interleaving or the gradient
all-reduce; those come from the paper's artifact script ``examples/sc21/run_table_1.sh`` in
NVIDIA/Megatron-LM (MBS, ``--num-layers-per-virtual-pipeline-stage``, ``--recompute-method
uniform``, DDP 'torch' = gradient all-reduce overlapped with the backward, 'local' = after it).
Table 2 (§5.2, "Comparison to ZeRO-3"; PTD-P vs ZeRO-3 without model parallelism, 175B and
530B, global batch fixed while the GPUs grow): scheme, parameters, model-parallel size, batch,
GPUs, micro-batch, achieved TFLOP/s per GPU (the same eq. (3) count). ZeRO-3 rows are pure data
parallelism (model-parallel size 1, micro-batch × GPUs = batch: one micro-batch per step); the
530B ZeRO-3 row at 640 GPUs ran batch 2560 ("did not fit on 560 GPUs when using a microbatch size
of 4 with ZeRO-3"). The table does not give the schedules; the rows assume full recomputation
(Megatron's --checkpoint-activations, as every run of the paper), and for PTD-P TP 8 × PP 12
(175B, model-parallel size 96) or × PP 35 (530B, 280), micro-batch 1 as listed, the
non-interleaved 1F1B schedule and the gradient all-reduce after the backward.

Hardware: Selene nodes are DGX A100 80 GB (8 GPUs, NVLink3/NVSwitch 300 GB/s per GPU per
direction, 8 × 200 Gb/s HDR InfiniBand per node), 312 TFLOP/s dense 16-bit peak per GPU — the
``A100-80GB`` cluster preset.

SHOEYBI — Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using
Model Parallelism" (arXiv 1909.08053). §5: up to 32 DGX-2H servers (512 V100-SXM3 32 GB; "300
GB/sec bandwidth between GPUs inside a server via NVSwitch and 100 GB/sec of interconnect
bandwidth between servers using 8 InfiniBand adapters per server"); vocabulary padded to 51200;
Table 1 (hidden per head 96): 1.2B = hidden 1536, 16 heads, 40 layers on 1 GPU; 8.3B = hidden
3072, 32 heads, 72 layers on 8 GPUs (model parallel) or 512 (model + 64-way data parallel). "A
fixed batch size of 8" for the model-parallel runs, global batch 512 for model + data parallel.
§5.1.1: the 1.2B single-GPU baseline "achieves 39 TeraFLOPS ... 30% of the theoretical peak FLOPS
for a single GPU in a DGX-2H server" (so a 130 TFLOP/s peak); the 8.3B on 8 GPUs reaches 77 % of
linear scaling (30.0 TFLOP/s per GPU); the abstract: "15.1 PetaFLOPs" on 512 GPUs (29.5 per GPU;
§5.1.1 says 74 % of linear, the abstract 76 %). Assumed: sequence 1024 (GPT-2's), activation
checkpointing with the FLOPs counted as in Narayanan's eq. (3), the gradient all-reduce after
the backward, NVSwitch 150 GB/s per direction.

MT-NLG — Smith et al., "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B"
(arXiv 2201.11990), §2.4 "System performance evaluation": 530B (105 layers, hidden 20480, 128
heads, sequence 2048) with 8-way tensor × 35-way pipeline parallelism, global batch 1920 on 280,
350 and 420 DGX A100 servers (2240, 2800, 3360 GPUs): 60.1, 50.2 and 44.4 s per iteration, 126,
121 and 113 TFLOP/s per GPU (the times reproduce those rates through eq. (3) with full
recomputation: checked in tests). Assumed: micro-batch 1, DeepSpeed's pipeline engine (1F1B, no
interleaving) with ZeRO-1 over the data-parallel replicas, vocabulary padded to 51200 (as
Megatron pads GPT-2's 50257 for TP 8).

BLOOM — BigScience's 176B run (arXiv 2211.05100; configuration and log in
bigscience-workshop/bigscience, train/tr11-176B-ml/README.md): 70 layers, hidden 14336, 112 heads,
sequence 2048, vocabulary 250880, ALiBi (no position table), bf16, on 384 A100-80GB (48 nodes of 8,
"NVLink 4 inter-gpu connects, 4 OmniPath links" of 100 Gb/s per node) with TP 4 × PP 12 × DP 8,
micro-batch 2, global batch 2048, ZeRO-1 (DeepSpeed's BF16_Optimizer), full activation
checkpointing; the log line at iteration 85376 (end of the first epoch, batch 2048): 104.70 s per
iteration, 149.77 TFLOPs (eq. (3): reproduced in tests). Assumed: NVLink 4 × 25 GB/s per GPU,
DeepSpeed's 1F1B pipeline, the 70 layers split 5/6/…/6/5 as the README's partition table shows.
"""
from __future__ import annotations

from sim.calibration.published_run import A100_PEAK, FAMILIES, SEQ, VOCAB, PublishedRun, megatron_flops  # noqa: F401 (re-exported)

KORTHIKANTI = "Korthikanti et al. 2022, arXiv 2205.05198"
NARAYANAN = "Narayanan et al. 2021, arXiv 2104.04473"
MTNLG = "Smith et al. 2022, arXiv 2201.11990"
SHOEYBI = "Shoeybi et al. 2019, arXiv 1909.08053"
BLOOM = "BigScience 2022, arXiv 2211.05100 and bigscience-workshop/bigscience train/tr11-176B-ml"


def _k(size, layers, hidden, heads, gpus, pp, batch, mbs, virtual, *, sel, time, reported=()):
    mode = "SP + selective recompute" if sel else "full recompute"
    return PublishedRun(
        f"korthikanti-{size}-{'seqsel' if sel else 'full'}",
        f"{KORTHIKANTI}: Table 5 row '{size} {'present work' if sel else 'full recompute'}' "
        f"({mode}, iteration time); configuration Table 3 row '{size}'",
        layers, hidden, heads, gpus, 8, pp, batch, mbs, "selective" if sel else "full",
        sequence_parallel=sel, virtual=virtual, iteration_time=time, reported=reported)


# Korthikanti et al., Table 3 (configuration) × Table 5 (iteration time, seconds).
KORTHIKANTI_TABLE5 = (
    _k("22B", 48, 6144, 64, 8, 1, 4, 4, 1, sel=False, time=1.42),
    _k("22B", 48, 6144, 64, 8, 1, 4, 4, 1, sel=True, time=1.10, reported=(("mfu", 0.415), ("hfu", 0.437))),
    _k("175B", 96, 12288, 96, 64, 8, 64, 1, 3, sel=False, time=18.13),
    _k("175B", 96, 12288, 96, 64, 8, 64, 1, 3, sel=True, time=13.75, reported=(("mfu", 0.514), ("hfu", 0.528))),
    _k("530B", 105, 20480, 128, 280, 35, 280, 1, 3, sel=False, time=49.05),
    _k("530B", 105, 20480, 128, 280, 35, 280, 1, 3, sel=True, time=37.83, reported=(("mfu", 0.560), ("hfu", 0.570))),
    _k("1T", 128, 25600, 160, 512, 64, 512, 1, 1, sel=False, time=94.42),
    _k("1T", 128, 25600, 160, 512, 64, 512, 1, 1, sel=True, time=71.49, reported=(("mfu", 0.563), ("hfu", 0.570))),
)


def _n(size, layers, hidden, heads, tp, pp, gpus, batch, tflops, peak, pflops, *, mbs, virtual=1, ddp):
    return PublishedRun(
        f"narayanan-{size}",
        f"{NARAYANAN}: Table 1 row '{size}' ({tflops} TFLOP/s per GPU, {peak}% of peak, {pflops} PFLOP/s "
        f"aggregate); micro-batch {mbs}, {virtual} chunk(s) per stage, DDP '{ddp}' from "
        f"NVIDIA/Megatron-LM examples/sc21/run_table_1.sh",
        layers, hidden, heads, gpus, tp, pp, batch, mbs, "full", virtual=virtual, tflops_per_gpu=tflops,
        flops="hardware", overlap_dp=ddp == "torch",
        reported=(("percent_of_peak", peak / 100), ("aggregate_pflops", pflops)))


# Narayanan et al., Table 1: params (B), heads, hidden, layers, TP, PP, GPUs, batch, TFLOP/s per GPU,
# % of peak, aggregate PFLOP/s; with run_table_1.sh's MBS, virtual stages and DDP implementation.
NARAYANAN_TABLE1 = (
    _n("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4, mbs=16, ddp="torch"),
    _n("3.6B", 30, 3072, 32, 2, 1, 64, 512, 138, 44, 8.8, mbs=16, ddp="torch"),
    _n("7.5B", 36, 4096, 32, 4, 1, 128, 512, 142, 46, 18.2, mbs=16, ddp="torch"),
    _n("18.4B", 40, 6144, 48, 8, 1, 256, 1024, 135, 43, 34.6, mbs=8, ddp="torch"),
    _n("39.1B", 48, 8192, 64, 8, 2, 512, 1536, 138, 44, 70.8, mbs=4, ddp="local"),
    _n("76.1B", 60, 10240, 80, 8, 4, 1024, 1792, 140, 45, 143.8, mbs=2, virtual=3, ddp="local"),
    _n("145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 148, 47, 227.1, mbs=2, virtual=2, ddp="local"),
    _n("310.1B", 96, 16384, 128, 8, 16, 1920, 2160, 155, 50, 297.4, mbs=1, virtual=2, ddp="local"),
    _n("529.6B", 105, 20480, 128, 8, 35, 2520, 2520, 163, 52, 410.2, mbs=1, virtual=3, ddp="local"),
    _n("1008.0B", 128, 25600, 160, 8, 64, 3072, 3072, 163, 52, 502.0, mbs=1, ddp="local"),
)


def _t2(scheme, size, gpus, batch, mbs, tflops, days):
    layers, hidden, heads = (96, 12288, 96) if size == "174.6B" else (105, 20480, 128)
    zero = scheme == "ZeRO-3"
    tp, pp = (1, 1) if zero else (8, 12 if size == "174.6B" else 35)
    return PublishedRun(
        f"narayanan-t2-{'zero3' if zero else 'ptdp'}-{size}-{gpus}",
        f"{NARAYANAN}: Table 2 (§5.2) row '{scheme}, {size}, {gpus} GPUs' (batch {batch}, micro-batch "
        f"{mbs}, {tflops} TFLOP/s per GPU, {days} days for 300B tokens)",
        layers, hidden, heads, gpus, tp, pp, batch, mbs, "full", tflops_per_gpu=tflops, flops="hardware",
        zero_stage=3 if zero else 0, family="zero3" if zero else "megatron",
        reported=(("days_300b_tokens", days),),
        assumptions="full recomputation; " + ("ZeRO-3 with DeepSpeed's defaults (overlap_comm, 5e8 buckets)"
                                              if zero else "1F1B, gradient all-reduce after the backward"))


# Narayanan et al., Table 2: scheme, parameters, GPUs, batch, micro-batch, TFLOP/s per GPU, days.
NARAYANAN_TABLE2 = tuple(_t2(*row) for row in (
    ("ZeRO-3", "174.6B", 384, 1536, 4, 144, 90), ("ZeRO-3", "174.6B", 768, 1536, 2, 88, 74),
    ("ZeRO-3", "174.6B", 1536, 1536, 1, 44, 74), ("ZeRO-3", "529.6B", 640, 2560, 4, 138, 169),
    ("ZeRO-3", "529.6B", 1120, 2240, 2, 98, 137), ("ZeRO-3", "529.6B", 2240, 2240, 1, 48, 140),
    ("PTD-P", "174.6B", 384, 1536, 1, 153, 84), ("PTD-P", "174.6B", 768, 1536, 1, 149, 43),
    ("PTD-P", "174.6B", 1536, 1536, 1, 141, 23), ("PTD-P", "529.6B", 560, 2240, 1, 171, 156),
    ("PTD-P", "529.6B", 1120, 2240, 1, 167, 80), ("PTD-P", "529.6B", 2240, 2240, 1, 159, 42),
))


# DGX-2H: 16 V100-SXM3 32 GB at 130 TFLOP/s peak, NVSwitch, 8 × 100 Gb/s InfiniBand per node.
DGX2H = (("peak_flops", 130e12), ("nvlink_bw", 150e9), ("ib_bw", 100e9), ("pcie_bw", 16e9))


def _s(size, hidden, heads, layers, gpus, tp, batch, tflops, quote):
    return PublishedRun(
        f"shoeybi-{size}-{gpus}gpu", f"{SHOEYBI}: Table 1 row '{size}'; {quote}", layers, hidden, heads, gpus, tp, 1,
        batch, batch // (gpus // tp), "full", tflops_per_gpu=tflops, flops="hardware", seq=1024, gpu="V100-32GB",
        gpus_per_node=16, node=DGX2H,
        assumptions="sequence 1024; activation checkpointing, FLOPs by eq. (3); all-reduce after the backward")


SHOEYBI_SCALING = (
    _s("1.2B", 1536, 16, 40, 1, 1, 8, 39.0, "§5.1.1: 39 TFLOP/s on one V100 (batch 8)"),
    _s("8.3B", 3072, 32, 72, 8, 8, 8, round(0.77 * 39.0, 2), "§5.1.1: 77 % of linear scaling on 8 GPUs (batch 8)"),
    _s("8.3B", 3072, 32, 72, 512, 8, 512, round(15.1e3 / 512, 2), "abstract: 15.1 PFLOP/s on 512 GPUs (batch 512)"),
)


def _mtnlg(servers, time, tflops):
    return PublishedRun(
        f"mtnlg-530B-{8 * servers}", f"{MTNLG}: §2.4, {servers} DGX A100 servers, batch 1920: {time} s per "
        f"iteration, {tflops} TFLOP/s per GPU", 105, 20480, 128, 8 * servers, 8, 35, 1920, 1, "full",
        iteration_time=time, flops="hardware", zero_stage=1, precision="bf16", framework="deepspeed",
        reported=(("tflops_per_gpu", tflops),),
        assumptions="micro-batch 1, 1F1B (DeepSpeed pipeline engine), DeepSpeed's ZeRO-1, vocabulary 51200")


MTNLG_530B = (_mtnlg(280, 60.1, 126), _mtnlg(350, 50.2, 121), _mtnlg(420, 44.4, 113))

BLOOM_176B = (PublishedRun(
    "bloom-176B", f"{BLOOM}: README 'Replica setup' (TP 4, PP 12, DP 8, MBS 2), 'Global batch size' (2048) "
    "and the log at iteration 85376: 104.70 s per iteration, 149.77 TFLOPs", 70, 14336, 112, 384, 4, 12,
    2048, 2, "full", iteration_time=104.70, flops="hardware", vocab=250880, zero_stage=1, precision="bf16",
    framework="deepspeed",
    positions="rotary", node=(("nvlink_bw", 100e9), ("ib_bw", 50e9)), reported=(("tflops_per_gpu", 149.77),),
    assumptions="ALiBi has no parameters (modelled as rotary: no position table); NVLink 4 × 25 GB/s; "
                "4 × 100 Gb/s Omni-Path per node; 1F1B; layers 5/6/.../6/5 over the 12 stages"),)


from sim.calibration.published_deepspeed import DEEPSPEED  # noqa: E402  (its rows are PublishedRuns too)
from sim.calibration.published_hopper import HOPPER, LLAMA3_405B, NEMOTRON4_15B  # noqa: E402,F401 (re-exported)
from sim.calibration.published_frameworks import FRAMEWORKS_H100  # noqa: E402

ALL = (KORTHIKANTI_TABLE5 + NARAYANAN_TABLE1 + NARAYANAN_TABLE2 + SHOEYBI_SCALING + MTNLG_530B + BLOOM_176B
       + DEEPSPEED + HOPPER + FRAMEWORKS_H100)
BY_NAME = {r.name: r for r in ALL}


def get(name: str) -> PublishedRun:
    if name not in BY_NAME:
        raise ValueError(f"unknown published run {name!r}; choose one of: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def family(name: str) -> tuple[PublishedRun, ...]:
    """Every row of one family: 'megatron', 'zero3', 'offload', 'h100' or 'fsdp'."""
    if name not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {name!r}")
    return tuple(r for r in ALL if r.family == name)
