"""A published training run as data: what was run, on what, what was measured, and from where.

``PublishedRun`` holds a model shape, the GPUs and their split (TP × PP × DP), the batch, the
schedule, recomputation, sequence parallelism, the ZeRO stage and offloading, the node it ran on
(GPU preset, GPUs per node, link overrides) and the numbers the paper reports (iteration time
and/or achieved TFLOP/s per GPU), with the table and row they come from. ``run.model()``,
``run.cluster()`` and ``run.plan()`` turn it into the simulator's inputs; ``megatron_flops`` is
the FLOPs formula the papers divide the time by to get their TFLOP/s (Megatron-LM's, which
Megatron-DeepSpeed, DeepSpeed's examples and BigScience log with as well).

The rows themselves live in sim.calibration.published (Megatron-LM's papers, MT-NLG, BLOOM),
sim.calibration.published_deepspeed (ZeRO's papers) and sim.calibration.published_hopper (H100 runs: Llama 3,
Nemotron-4).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from sim.cost.flops import model_flops_per_step
from sim.spec.hardware import Cluster
from sim.spec.model import Model
from sim.spec.plan import Plan

SEQ, VOCAB = 2048, 51200
A100_PEAK = 312e12
FAMILIES = ("megatron", "zero3", "offload", "h100", "fsdp", "fp8")


@dataclass(frozen=True)
class PublishedRun:
    """One published configuration and its measurement.

    ``iteration_time`` (s) and/or ``tflops_per_gpu`` as reported; ``flops`` names the formula
    behind the reported TFLOP/s ('model': 72Bslh²(1 + s/6h + V/12lh), recomputation not counted;
    'hardware': what the GPUs ran, i.e. with the recomputation — 96Bslh²(1 + s/6h + V/16lh) for full;
    'sim': sim.cost.flops.model_flops_per_step, 3 × the forward of the model as shaped (grouped-query
    attention, gated MLP) with the output head, recomputation not counted — PaLM's 6N + 12·l·h·s
    per token, which the H100 papers' MFU uses, with N leaving out the input embedding (a lookup:
    counted as 6hV it would add 10 % to Nemotron-4 15B, whose reported MFU follows without it)).
    ``overlap_dp``: the data-parallel gradient all-reduce overlaps the last backward (DDP 'torch').
    ``family``: 'megatron' (tensor × pipeline parallel, DP all-reduce or ZeRO-1), 'zero3' (ZeRO-3
    data parallelism), 'offload' (ZeRO with the optimizer on the CPU), 'h100' (runs on H100s,
    tensor × pipeline parallel: their GEMM efficiency is fitted apart). ``shape``: ``sim.Model``
    fields that differ from a GPT block (ffn, gated, norm, kv_heads, dropout, bias, tied), as
    (name, value) pairs. ``attention``: the Plan's 'eager' or 'flash'. ``pipeline_layers``: the
    layer slots the pipeline is cut into, when the run gives the embedding and the output layer
    a slot of their own (Llama 3); the simulation runs that many layers (``sim_model``), the FLOPs
    count the model's ``layers``. ``framework`` 'fsdp2' (family 'fsdp': PyTorch FSDP, data
    parallelism only) with ``reshard_after_forward`` (FULL_SHARD; False: SHARD_GRAD_OP);
    ``kernels`` the Plan's 'fused' or 'eager'; ``fp8``: GEMMs in FP8 (the Plan's ``fp8``; family 'fp8'); ``recompute_gemms``, ``backward_prefetch`` the Plan's. ``node``: Cluster fields
    that differ from the ``gpu`` preset, as (name, value) pairs. ``assumptions``: what the paper
    does not say and the row assumes.
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
    zero_stage: int = 0
    offload_optimizer: str = "none"
    precision: str = "fp16"
    gpus_per_node: int = 8
    node: tuple = ()
    positions: str = "learned"
    family: str = "megatron"
    shape: tuple = ()
    attention: str = "eager"
    pipeline_layers: int | None = None
    reshard_after_forward: bool = True
    kernels: str = "fused"
    fp8: bool = False
    recompute_gemms: float = 0.0
    backward_prefetch: bool = True
    assumptions: str = ""
    cp: int = 1              # context parallelism (Plan.cp, Plan.cp_kind)
    cp_kind: str = "ring"
    framework: str = ""  # whose collectives (Plan.framework); '': Megatron's up to ZeRO-1, DeepSpeed's beyond

    def __post_init__(self):
        if self.gpus % (self.tp * self.pp * self.cp):
            raise ValueError(f"{self.name}: {self.gpus} GPUs do not split into TP {self.tp} × PP {self.pp} "
                             f"× CP {self.cp}")
        if self.global_batch % (self.dp * self.micro_batch):
            raise ValueError(f"{self.name}: batch {self.global_batch} is not DP {self.dp} × micro-batch "
                             f"{self.micro_batch} × a whole number of micro-batches")
        if self.iteration_time is None and self.tflops_per_gpu is None:
            raise ValueError(f"{self.name}: a published run needs a measurement")
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: family must be one of {FAMILIES}, got {self.family!r}")
        if self.flops not in ("model", "hardware", "sim"):
            raise ValueError(f"{self.name}: flops must be 'model', 'hardware' or 'sim', got {self.flops!r}")

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    def model(self) -> Model:
        return Model(self.name, self.layers, self.hidden, self.heads, self.vocab, self.seq,
                     positions=self.positions, **dict(self.shape))

    def sim_model(self) -> Model:
        """The model the simulation runs: ``model()`` with ``pipeline_layers`` layers if set."""
        m = self.model()
        return m if self.pipeline_layers is None else replace(m, layers=self.pipeline_layers)

    def cluster(self) -> Cluster:
        per_node = min(self.gpus_per_node, self.gpus)
        return Cluster.preset(self.gpu, nodes=max(1, self.gpus // per_node), gpus_per_node=per_node,
                              **dict(self.node))

    def plan(self) -> Plan:
        """The run as configured. Megatron (no ZeRO, or DeepSpeed's ZeRO-1 under its pipeline
        engine): 1F1B or interleaved, gradient clipping 1.0; with DDP 'torch' the gradients are
        all-reduced in PyTorch DDP's 25 MB buckets during the last backward, else after it.
        ZeRO-2/3 (DeepSpeed): its defaults, overlap_comm on, 5e8-element buckets. The collectives are
        Megatron's up to ZeRO-1 (its distributed optimizer), DeepSpeed's beyond, unless ``framework``
        says whose."""
        if self.framework == "fsdp2":
            return self._fsdp_plan()
        deepspeed = self.zero_stage >= 2
        framework = self.framework or ("deepspeed" if deepspeed else "megatron")
        return Plan(framework=framework, zero_stage=self.zero_stage, tp=self.tp, pp=self.pp, dp=self.dp,
                    micro_batch_size=self.micro_batch, num_microbatches=self.num_microbatches,
                    schedule="interleaved" if self.virtual > 1 else "1f1b", virtual=self.virtual,
                    recompute=self.recompute, sequence_parallel=self.sequence_parallel, precision=self.precision,
                    offload_optimizer=self.offload_optimizer, overlap_comm=self.overlap_dp or deepspeed,
                    reduce_bucket_size=12_500_000 if self.overlap_dp and not deepspeed else 500_000_000,
                    gradient_clipping=1.0, attention=self.attention, kernels=self.kernels, fp8=self.fp8,
                    recompute_gemms=self.recompute_gemms, cp=self.cp, cp_kind=self.cp_kind)

    def _fsdp_plan(self) -> Plan:
        """PyTorch FSDP: gradients reduce-scattered per block during the backward, bf16 gathers;
        SHARD_GRAD_OP keeps the gathered parameters from the forward to the backward."""
        return Plan(zero_stage=3, tp=self.tp, dp=self.dp,
                    sequence_parallel=self.sequence_parallel, micro_batch_size=self.micro_batch,
                    num_microbatches=self.num_microbatches, recompute=self.recompute, precision=self.precision,
                    overlap_comm=True, gradient_clipping=1.0, attention=self.attention, kernels=self.kernels,
                    framework="fsdp2", reshard_after_forward=self.reshard_after_forward, fp8=self.fp8,
                    recompute_gemms=self.recompute_gemms, cp=self.cp, cp_kind=self.cp_kind,
                    backward_prefetch=self.backward_prefetch)

    def step_flops(self) -> float:
        """The FLOPs of one iteration as the paper counts them for its TFLOP/s (``flops``)."""
        if self.flops == "sim":
            return model_flops_per_step(self.model(), self.global_batch)
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
