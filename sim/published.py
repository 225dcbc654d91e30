"""Published training runs as data: what was run, on what, and what was measured — with the source.

Each ``PublishedRun`` holds a model shape, the GPUs and their split (TP × PP × DP), the batch,
the schedule, recomputation and sequence parallelism, and the numbers the paper reports
(iteration time and/or achieved TFLOP/s per GPU), with the table and row they come from.
``run.model()``, ``run.cluster()`` and ``run.plan()`` turn it into the simulator's inputs;
``megatron_flops`` is the FLOPs formula the papers divide by the time to get their TFLOP/s.

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
follow from Table 5's times through the paper's formulas (checked in tests/test_sim_published.py).
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
Table 2 (PTD-P vs ZeRO-3 without model parallelism, 175B and 530B) is recorded too
(``NARAYANAN_TABLE2``) but is not part of the validation set: its schedules are not published.

Hardware: Selene nodes are DGX A100 80 GB (8 GPUs, NVLink3/NVSwitch 300 GB/s per GPU per
direction, 8 × 200 Gb/s HDR InfiniBand per node), 312 TFLOP/s dense 16-bit peak per GPU — the
``A100-80GB`` cluster preset.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.config import Cluster, Model
from sim.plan import Plan

SEQ, VOCAB = 2048, 51200
A100_PEAK = 312e12

KORTHIKANTI = "Korthikanti et al. 2022, arXiv 2205.05198"
NARAYANAN = "Narayanan et al. 2021, arXiv 2104.04473"


@dataclass(frozen=True)
class PublishedRun:
    """One published configuration and its measurement.

    ``iteration_time`` (s) and/or ``tflops_per_gpu`` as reported; ``flops`` names the formula
    behind the reported TFLOP/s ('model': 72Bslh²(1 + s/6h + V/12lh), recomputation not counted;
    'hardware': what the GPUs ran, i.e. with the recomputation — 96Bslh²(1 + s/6h + V/16lh) for full).
    ``overlap_dp``: the data-parallel gradient all-reduce overlaps the last backward (DDP 'torch').
    """

    name: str
    source: str
    layers: int
    hidden: int
    heads: int
    gpus: int
    tp: int
    pp: int
    global_batch: int
    micro_batch: int
    recompute: str
    sequence_parallel: bool = False
    virtual: int = 1
    iteration_time: float | None = None
    tflops_per_gpu: float | None = None
    flops: str = "model"
    overlap_dp: bool = False
    reported: tuple = ()  # other reported numbers, as (name, value) pairs
    seq: int = SEQ
    vocab: int = VOCAB
    gpu: str = "A100-80GB"

    def __post_init__(self):
        if self.gpus % (self.tp * self.pp):
            raise ValueError(f"{self.name}: {self.gpus} GPUs do not split into TP {self.tp} × PP {self.pp}")
        if self.global_batch % (self.dp * self.micro_batch):
            raise ValueError(f"{self.name}: batch {self.global_batch} is not DP {self.dp} × micro-batch "
                             f"{self.micro_batch} × a whole number of micro-batches")
        if self.iteration_time is None and self.tflops_per_gpu is None:
            raise ValueError(f"{self.name}: a published run needs a measurement")

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    def model(self) -> Model:
        return Model(self.name, self.layers, self.hidden, self.heads, self.vocab, self.seq)

    def cluster(self) -> Cluster:
        return Cluster.preset(self.gpu, nodes=max(1, self.gpus // 8), gpus_per_node=min(8, self.gpus))

    def plan(self) -> Plan:
        """Megatron as run: no ZeRO (no distributed optimizer), fp16 mixed precision, 1F1B or interleaved,
        gradient clipping 1.0; with DDP 'torch' the gradients are all-reduced in PyTorch DDP's
        25 MB buckets during the last backward, with 'local' DDP after it."""
        return Plan(zero_stage=0, tp=self.tp, pp=self.pp, dp=self.dp, micro_batch_size=self.micro_batch,
                    num_microbatches=self.num_microbatches,
                    schedule="interleaved" if self.virtual > 1 else "1f1b", virtual=self.virtual,
                    recompute=self.recompute, sequence_parallel=self.sequence_parallel, precision="fp16",
                    overlap_comm=self.overlap_dp, reduce_bucket_size=12_500_000 if self.overlap_dp else 500_000_000,
                    gradient_clipping=1.0)

    def step_flops(self) -> float:
        """The FLOPs of one iteration as the paper counts them for its TFLOP/s (``flops``)."""
        return megatron_flops(self.model(), self.global_batch,
                              recompute=self.recompute if self.flops == "hardware" else "none")

    def tflops_from_time(self, seconds: float) -> float:
        """TFLOP/s per GPU the paper would report for an iteration of ``seconds``."""
        return self.step_flops() / (self.gpus * seconds) / 1e12

    def time_from_tflops(self, tflops: float) -> float:
        return self.step_flops() / (self.gpus * tflops * 1e12)

    @property
    def measured_time(self) -> float:
        """The iteration time: reported, or implied by the reported TFLOP/s and the paper's formula."""
        return self.iteration_time if self.iteration_time is not None else self.time_from_tflops(self.tflops_per_gpu)


def megatron_flops(model: Model, batch: int, recompute: str = "none") -> float:
    """FLOPs of one iteration by the Megatron papers' count (GEMMs and attention only; GPT, f = 4h).

    recompute 'none':      72·B·s·l·h²·(1 + s/6h + V/12lh)    (Korthikanti §6, model FLOPs)
    recompute 'selective': 72·B·s·l·h²·(1 + s/3h + V/12lh)    (attention core recomputed)
    recompute 'full':      96·B·s·l·h²·(1 + s/6h + V/16lh)    (Narayanan eq. 3: one more forward)
    """
    B, s, l, h, V = batch, model.seq, model.layers, model.hidden, model.vocab
    if model.ffn_hidden != 4 * h or model.gated:
        raise ValueError("megatron_flops assumes the GPT MLP (ffn = 4h, not gated)")
    if recompute == "none":
        return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    if recompute == "selective":
        return 72 * B * s * l * h * h * (1 + s / (3 * h) + V / (12 * l * h))
    if recompute == "full":
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")


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


@dataclass(frozen=True)
class PublishedThroughput:
    """A reported throughput without a fully published configuration (not simulated)."""

    scheme: str
    params_b: float
    model_parallel: int
    global_batch: int
    gpus: int
    micro_batch: int
    tflops_per_gpu: float
    days_300b_tokens: float
    source: str = f"{NARAYANAN}: Table 2 (PTD-P vs ZeRO-3 without model parallelism)"


# Narayanan et al., Table 2. ZeRO-3 rows are pure data parallelism: model-parallel size 1 and
# micro-batch × GPUs = batch (a transcription we read shows 2 in that column for the 768- and
# 1120-GPU rows, which the batch arithmetic contradicts). The 530B ZeRO-3 row at 640 GPUs ran batch
# 2560 (micro-batch 4 did not fit on 560 GPUs). PTD-P: TP 8 × PP 12 (175B) or × PP 35 (530B).
NARAYANAN_TABLE2 = tuple(PublishedThroughput(*row) for row in (
    ("ZeRO-3", 174.6, 1, 1536, 384, 4, 144, 90), ("ZeRO-3", 174.6, 1, 1536, 768, 2, 88, 74),
    ("ZeRO-3", 174.6, 1, 1536, 1536, 1, 44, 74), ("ZeRO-3", 529.6, 1, 2560, 640, 4, 138, 169),
    ("ZeRO-3", 529.6, 1, 2240, 1120, 2, 98, 137), ("ZeRO-3", 529.6, 1, 2240, 2240, 1, 48, 140),
    ("PTD-P", 174.6, 96, 1536, 384, 1, 153, 84), ("PTD-P", 174.6, 96, 1536, 768, 1, 149, 43),
    ("PTD-P", 174.6, 96, 1536, 1536, 1, 141, 23), ("PTD-P", 529.6, 280, 2240, 560, 1, 171, 156),
    ("PTD-P", 529.6, 280, 2240, 1120, 1, 167, 80), ("PTD-P", 529.6, 280, 2240, 2240, 1, 159, 42),
))

ALL = KORTHIKANTI_TABLE5 + NARAYANAN_TABLE1
BY_NAME = {r.name: r for r in ALL}


def get(name: str) -> PublishedRun:
    if name not in BY_NAME:
        raise ValueError(f"unknown published run {name!r}; choose one of: {', '.join(BY_NAME)}")
    return BY_NAME[name]
