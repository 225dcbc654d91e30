"""How a model is trained on a cluster: a ``Plan`` (parallel degrees, ZeRO, schedule, batch, precision).

A frozen dataclass that checks each field on construction and names the bad one.
``Plan.from_deepspeed(config, world_size, tp, pp)`` reads a DeepSpeed config dict with
zero_ref.config (DeepSpeed's keys, defaults, checks and batch arithmetic) and maps it onto a plan.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from zero_ref import config as ds_config
from zero_ref.memory import RECIPES, ALIASES
from sim.spec.checks import one_of, positive_int

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("eager", "flash")
OFFLOAD = ("none", "cpu", "nvme")
CP_KINDS = ("ring", "ulysses")
KERNELS = ("fused", "eager")
# whose collectives a plan's data parallelism issues; 'zero_ref': the course's reference, the ZeRO paper's
FRAMEWORKS = ("deepspeed", "megatron", "fsdp2", "zero_ref")
REDUCE_DTYPES = ("fp32", "bf16")
_DEEPSPEED = ds_config.Config()  # DeepSpeed's defaults, for the knobs a Plan shares with its config


@dataclass(frozen=True)
class Plan:
    """One training configuration: tp × pp × dp ranks, ZeRO ``zero_stage``, and the step's schedule.

    Each step runs ``num_microbatches`` micro-batches of ``micro_batch_size`` sequences per pipeline
    (DeepSpeed's gradient_accumulation_steps); the global batch is micro_batch_size ×
    num_microbatches × dp. ``schedule`` 'interleaved' splits each stage into ``virtual`` chunks;
    'zb-h1' is zero-bubble ZB-H1 (the backward split into input- and weight-gradient passes).
    ZeRO knobs (DeepSpeed names): ``overlap_comm`` reduces gradients bucket by bucket during
    backward (else after it), ``reduce_bucket_size``/``allgather_bucket_size`` in elements;
    ``offload_optimizer``/``offload_param`` 'none' | 'cpu' | 'nvme'. ``gradient_clipping`` > 0 adds a
    global norm all-reduce that makes every stage wait for the slowest before its optimizer step.
    The bucket sizes and clipping default to DeepSpeed's; ``overlap_comm`` is on at every stage
    (DeepSpeed turns it on for stage 3 only, which ``from_deepspeed`` follows).
    ``attention``: 'eager' materialises the a·s² attention scores (and keeps them for backward),
    'flash' (FlashAttention) keeps a log-sum-exp per head and token instead and recomputes the
    scores in backward (zero_ref.memory.activation_terms, sim.cost.flops.layer_backward_flops). The
    default is 'eager' because the published runs the simulator is calibrated and validated on
    (Megatron-LM and DeepSpeed, 2020–2022) materialised the scores; plans for today's runs say
    'flash' (``python -m sim plan`` does). ``cp`` splits each sequence over a context-parallel
    group, ``cp_kind`` 'ring' (ring attention) or 'ulysses' (DeepSpeed-Ulysses); the world is
    tp × cp × pp × dp, the cp group holding the same parameters as its dp group (gradients and
    ZeRO span dp·cp ranks); ``sim.simulate`` schedules its traffic (sim.step.lowering).

    ``framework`` says whose data-parallel collectives the step issues (sim.step.lowering cites
    each): 'deepspeed' (0.19.8: stages 1–2 all-reduce each gradient bucket, then all-gather the
    parameters), 'megatron' (Megatron-Core: zero_stage 1 is its distributed optimizer, a
    reduce-scatter of the gradients and an all-gather of the parameters), 'fsdp2' (torch's
    fully_shard, zero_stage 3: one unit per transformer layer) or 'zero_ref' (this course's
    reference: the ZeRO paper's reduce-scatter at stages 1–3). FSDP2 only: ``reshard_after_forward``
    (False keeps a unit's gathered parameters from its forward to its backward: no backward
    all-gathers, ZeRO-2-like traffic), ``reduce_dtype`` of the gradient reduce-scatter ('fp32', the
    common torchtitan MixedPrecisionPolicy with bf16 parameters, or 'bf16'), and ``dp_shard``: 0
    shards over the whole dp group; 1 < dp_shard < dp (dividing it) is HSDP, sharding within groups
    of dp_shard ranks and replicating across dp // dp_shard of them (with cp, each shard group also
    spans the cp ranks, as torchtitan's dp_shard_cp mesh). Megatron only:
    ``overlap_param_gather`` (its DDP config's flag) all-gathers the updated parameters during the
    next step's first forward, bucket by bucket, instead of at the end of the optimizer step.
    ``kernels``: 'fused' (Megatron's and Transformer Engine's fused kernels, torch.compile) or 'eager' (PyTorch eager, one kernel per op:
    more element-wise bytes, ``Costs.eager_traffic``). ``fp8``: the GEMMs run in FP8 (Transformer
    Engine, torchao's Float8 linears) at ``Costs.fp8_efficiency`` of the FP8 peak; attention, the
    element-wise kernels, the collectives and the memory stay as ``precision`` says.
    ``recompute_gemms``: the share of each layer's projection GEMMs its backward runs again besides
    ``recompute`` (per-op selective checkpointing, sim.cost.flops.op_sac_share; its memory is not modelled).
    ``backward_prefetch`` (FSDP only): the next unit's backward all-gather is issued ahead (FSDP2; FSDP1's
    BACKWARD_PRE); False issues it when the current unit's backward ends (FSDP1's BACKWARD_POST,
    Composer's default), as DeepSpeed's ZeRO-3 does.
    DeepSpeed ZeRO-3 only, ZeRO++ (DeepSpeed's zero_optimization keys; sim.step.zeropp):
    ``zero_quantized_weights`` (qwZ: int8 all-gathers), ``zero_hpz_partition_size`` (hpZ: 0 or 1 off, else
    a divisor of dp·cp, typically the GPUs per node: a secondary parameter shard per sub-group of that
    many ranks) and ``zero_quantized_gradients`` (qgZ: the reduce-scatter as an int4 all-to-all).
    """

    zero_stage: int = 0
    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch_size: int = 1
    num_microbatches: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    precision: str = "bf16"
    offload_optimizer: str = "none"
    offload_param: str = "none"
    overlap_comm: bool = True
    reduce_bucket_size: int = _DEEPSPEED.zero_optimization.reduce_bucket_size
    allgather_bucket_size: int = _DEEPSPEED.zero_optimization.allgather_bucket_size
    gradient_clipping: float = _DEEPSPEED.gradient_clipping
    attention: str = "eager"
    cp: int = 1
    cp_kind: str = "ring"
    framework: str = "deepspeed"
    reshard_after_forward: bool = True
    dp_shard: int = 0
    reduce_dtype: str = "fp32"
    overlap_param_gather: bool = False
    kernels: str = "fused"
    fp8: bool = False
    recompute_gemms: float = 0.0
    backward_prefetch: bool = True
    zero_quantized_weights: bool = False
    zero_hpz_partition_size: int = 1
    zero_quantized_gradients: bool = False

    def __post_init__(self):
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ValueError(f"Plan.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        for f in ("tp", "pp", "dp", "cp", "micro_batch_size", "num_microbatches", "virtual",
                  "reduce_bucket_size", "allgather_bucket_size"):
            positive_int("Plan", f, getattr(self, f))
        one_of("Plan", "schedule", self.schedule, SCHEDULES)
        one_of("Plan", "recompute", self.recompute, RECOMPUTE)
        one_of("Plan", "attention", self.attention, ATTENTION)
        one_of("Plan", "precision", self.precision, tuple(RECIPES) + tuple(ALIASES))
        one_of("Plan", "offload_optimizer", self.offload_optimizer, OFFLOAD)
        one_of("Plan", "offload_param", self.offload_param, OFFLOAD)
        one_of("Plan", "cp_kind", self.cp_kind, CP_KINDS)
        one_of("Plan", "kernels", self.kernels, KERNELS)
        if not isinstance(self.fp8, bool):
            raise ValueError(f"Plan.fp8 must be True or False, got {self.fp8!r}")
        if isinstance(self.recompute_gemms, bool) or not isinstance(self.recompute_gemms, (int, float)) or not (
                0 <= self.recompute_gemms <= 1):
            raise ValueError(f"Plan.recompute_gemms must be a share between 0 and 1, got {self.recompute_gemms!r}")
        if self.virtual > 1 and self.schedule != "interleaved":
            raise ValueError(f"Plan.virtual={self.virtual} needs schedule='interleaved' (got {self.schedule!r})")
        if self.schedule == "interleaved" and self.num_microbatches % self.pp:
            raise ValueError(f"Plan.num_microbatches {self.num_microbatches} must be a multiple of Plan.pp "
                             f"{self.pp} for the interleaved schedule (Megatron's condition)")
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            raise ValueError("Plan.offload_optimizer needs zero_stage >= 1 (ZeRO-Offload)")
        if self.offload_optimizer == "nvme" and self.zero_stage != 3:
            raise ValueError("Plan.offload_optimizer='nvme' needs zero_stage=3 (ZeRO-Infinity)")
        if self.offload_param != "none" and self.zero_stage != 3:
            raise ValueError("Plan.offload_param needs zero_stage=3: only ZeRO-3 partitions the parameters")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("Plan.sequence_parallel needs tp > 1 (it splits along the tensor-parallel group)")
        if not isinstance(self.gradient_clipping, (int, float)) or self.gradient_clipping < 0:
            raise ValueError(f"Plan.gradient_clipping must be a number >= 0, got {self.gradient_clipping!r}")
        self._check_framework()
        self._check_zeropp()

    def _check_zeropp(self):
        """ZeRO++'s fields: DeepSpeed ZeRO-3 only; the hpZ size tiles the dp·cp ranks."""
        for name in ("zero_quantized_weights", "zero_quantized_gradients"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Plan.{name} must be True or False, got {getattr(self, name)!r}")
        g = self.zero_hpz_partition_size
        if isinstance(g, bool) or not isinstance(g, int) or g < 0:
            raise ValueError(f"Plan.zero_hpz_partition_size must be 0 or 1 (hpZ off) or a divisor of dp·cp, got {g!r}")
        on = [n for n in ("zero_quantized_weights", "zero_quantized_gradients") if getattr(self, n)]
        on += ["zero_hpz_partition_size"] * (g > 1)
        if on and (self.framework, self.zero_stage) != ("deepspeed", 3):
            raise ValueError(f"Plan.{on[0]} is DeepSpeed's ZeRO++, which runs on ZeRO-3: it needs "
                             f"framework='deepspeed' and zero_stage=3 (got {self.framework!r}, {self.zero_stage})")
        if g > 1 and (self.dp * self.cp) % g:
            raise ValueError(f"Plan.zero_hpz_partition_size={g} does not divide the dp·cp = {self.dp * self.cp} "
                             "ranks: use the GPUs per node (a divisor of dp·cp), or 1 to turn hpZ off")

    @property
    def hpz(self) -> int:
        """hpZ's sub-group size (1: off)."""
        return max(self.zero_hpz_partition_size, 1)

    @property
    def zeropp(self) -> bool:
        """Whether any of ZeRO++'s three is on."""
        return self.zero_quantized_weights or self.zero_quantized_gradients or self.hpz > 1

    def _check_framework(self):
        """The framework's fields: each check names the field and what to use instead."""
        one_of("Plan", "framework", self.framework, FRAMEWORKS)
        one_of("Plan", "reduce_dtype", self.reduce_dtype, REDUCE_DTYPES)
        if not isinstance(self.overlap_param_gather, bool):
            raise ValueError(f"Plan.overlap_param_gather must be True or False, got {self.overlap_param_gather!r}")
        if self.overlap_param_gather and (self.framework, self.zero_stage) != ("megatron", 1):
            raise ValueError("Plan.overlap_param_gather is Megatron-Core's distributed-optimizer setting; it needs "
                             f"framework='megatron' and zero_stage=1 (got {self.framework!r}, {self.zero_stage})")
        if not isinstance(self.reshard_after_forward, bool):
            raise ValueError(f"Plan.reshard_after_forward must be True or False, got {self.reshard_after_forward!r}")
        if isinstance(self.dp_shard, bool) or not isinstance(self.dp_shard, int) or self.dp_shard < 0:
            raise ValueError(f"Plan.dp_shard must be 0 (shard over all of dp) or a divisor of Plan.dp, "
                             f"got {self.dp_shard!r}")
        fsdp = self.framework == "fsdp2"
        for name, default in (("reshard_after_forward", True), ("dp_shard", 0), ("reduce_dtype", "fp32"),
                              ("backward_prefetch", True)):
            if not fsdp and getattr(self, name) != default:
                raise ValueError(f"Plan.{name} is an FSDP2 setting; it needs framework='fsdp2' "
                                 f"(got framework={self.framework!r})")
        if self.framework == "megatron" and self.zero_stage > 1:
            raise ValueError(f"Plan.zero_stage={self.zero_stage} with framework='megatron': Megatron-Core's "
                             "distributed optimizer shards the optimizer states only (zero_stage 1); use "
                             "framework='deepspeed' for ZeRO-2/3 or 'fsdp2' to shard the parameters")
        if fsdp and self.zero_stage != 3:
            raise ValueError(f"Plan.zero_stage={self.zero_stage} with framework='fsdp2': fully_shard shards "
                             "parameters, gradients and optimizer states, so FSDP2 plans use zero_stage=3")
        if self.framework != "deepspeed" and (self.offload_optimizer, self.offload_param) != ("none", "none"):
            raise ValueError(f"Plan.offload_optimizer/offload_param model DeepSpeed's ZeRO-Offload; "
                             f"use framework='deepspeed' (got {self.framework!r})")
        if self.dp_shard and (self.dp_shard in (1, self.dp) or self.dp % self.dp_shard):
            raise ValueError(f"Plan.dp_shard={self.dp_shard} must divide Plan.dp={self.dp} with "
                             f"1 < dp_shard < dp (HSDP), or be 0 to shard over the whole dp group")

    @property
    def shard_group(self) -> int:
        """Ranks the sharded model states are split over: dp·cp, or dp_shard·cp under HSDP (the cp ranks of a
        data-parallel rank hold the same parameters)."""
        return (self.dp_shard or self.dp) * self.cp

    @property
    def replicas(self) -> int:
        """Copies of the sharded states: dp // dp_shard under HSDP, else 1."""
        return self.dp // (self.dp_shard or self.dp)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro_batch_size × num_microbatches × dp."""
        return self.micro_batch_size * self.num_microbatches * self.dp

    @classmethod
    def from_deepspeed(cls, config: dict, world_size: int, tp: int = 1, pp: int = 1, **overrides) -> "Plan":
        """A Plan from a DeepSpeed config dict on ``world_size`` GPUs split tp × pp × dp.

        zero_ref.config reads the config as DeepSpeed does (``parse(config, dp=dp, strict=False)``):
        DeepSpeed's defaults, its checks (an error names the key) and its batch arithmetic
        (train_batch_size = micro × accumulation × dp, the micro-batches forming the pipeline). Keys
        that the simulator does not model but DeepSpeed accepts (another optimizer, a monitor, ...)
        are accepted and do not change the plan. The plan takes the batch, the precision,
        zero_optimization's stage, overlap_comm, bucket sizes and offload devices, ZeRO++'s three keys
        at stage 3 (DeepSpeed ignores them below it; zero_quantized_nontrainable_weights: every simulated
        weight trains), and gradient_clipping. ``overrides`` set fields DeepSpeed's config does not hold (schedule,
        virtual, recompute, sequence_parallel, attention).
        """
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        positive_int("from_deepspeed", "world_size", world_size)
        positive_int("from_deepspeed", "tp", tp)
        positive_int("from_deepspeed", "pp", pp)
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown Plan field(s): {', '.join(sorted(unknown))}")
        if overrides.get("framework", "deepspeed") in ("megatron", "fsdp2"):
            raise ValueError(f"from_deepspeed makes DeepSpeed plans; framework={overrides['framework']!r} "
                             "runs no DeepSpeed config (build that Plan directly)")
        cp = overrides.get("cp", 1)  # a context-parallel group shares its sequences: not a data-parallel axis
        positive_int("from_deepspeed", "cp", cp)
        if world_size % (tp * pp * cp):
            raise ValueError(f"world_size {world_size} is not divisible by tp × pp × cp = {tp} × {pp} × {cp}")
        cfg = ds_config.parse(config, dp=world_size // (tp * pp * cp), strict=False, unknown_keys="error")
        return cls(**{**_from_config(cfg), "tp": tp, "pp": pp, **overrides})

    def to_deepspeed(self, *, nvme_path: str = "/local_nvme", **extra) -> dict:
        """This plan as a DeepSpeed config dict: the inverse of ``from_deepspeed``.

        The config holds the batch keys (train_batch_size = micro-batch × accumulation steps × dp,
        the accumulation steps being the pipeline's micro-batches), bf16/fp16, zero_optimization
        and gradient_clipping. The rest of a plan is not in a DeepSpeed config: tp and pp belong to
        the launcher and the model (Megatron's mpu, DeepSpeed's PipelineModule), recompute,
        sequence_parallel, schedule, virtual, attention and cp (with cp_kind) to the model code. So
        ``Plan.from_deepspeed(plan.to_deepspeed(), plan.world_size, plan.tp, plan.pp, recompute=...,
        sequence_parallel=..., schedule=..., virtual=..., attention=...) == plan``. NVMe offload writes ``nvme_path``;
        ``extra`` adds top-level sections (an "optimizer", "steps_per_print", ...).
        """
        if self.framework in ("megatron", "fsdp2"):  # zero_ref reads DeepSpeed's configs
            raise ValueError(f"Plan.framework={self.framework!r}: only a DeepSpeed (or zero_ref) plan has a "
                             "DeepSpeed config (set framework='deepspeed' to write one)")
        precision = ALIASES.get(self.precision, self.precision)
        if precision not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"Plan.precision {self.precision!r} has no DeepSpeed config of its own "
                             "(bf16.enabled, fp16.enabled or neither); use 'bf16', 'fp16' or 'fp32'")
        zero = {"stage": self.zero_stage, "overlap_comm": self.overlap_comm,
                "reduce_bucket_size": self.reduce_bucket_size, "allgather_bucket_size": self.allgather_bucket_size}
        if self.zeropp:
            zero.update(zero_quantized_weights=self.zero_quantized_weights,
                        zero_hpz_partition_size=self.zero_hpz_partition_size,
                        zero_quantized_gradients=self.zero_quantized_gradients)
        for key, device in (("offload_optimizer", self.offload_optimizer), ("offload_param", self.offload_param)):
            if device != "none":
                zero[key] = {"device": device, **({"nvme_path": nvme_path} if device == "nvme" else {})}
        config = {"train_batch_size": self.global_batch, "train_micro_batch_size_per_gpu": self.micro_batch_size,
                  "gradient_accumulation_steps": self.num_microbatches,
                  **({precision: {"enabled": True}} if precision != "fp32" else {}),
                  "zero_optimization": zero, "gradient_clipping": float(self.gradient_clipping)}
        clash = sorted(set(extra) & (set(config) | {"bf16", "fp16"}))
        if clash:
            raise ValueError(f"to_deepspeed: {', '.join(clash)} come from the plan; change the Plan instead")
        return {**config, **extra}


def _from_config(cfg: ds_config.Config) -> dict:
    """The Plan fields a parsed DeepSpeed config holds (parsed with ``dp``)."""
    zero = cfg.zero_optimization
    if zero.allgather_bucket_size == 0:  # DeepSpeed's range starts at 0; the simulator's buckets hold something
        raise ValueError("zero_optimization.allgather_bucket_size must be a positive integer to plan with, got 0")
    return dict(
        zero_stage=zero.stage, dp=cfg.batch.dp, precision=cfg.precision,
        micro_batch_size=cfg.batch.train_micro_batch_size_per_gpu,
        num_microbatches=cfg.batch.gradient_accumulation_steps,
        offload_optimizer=zero.offload_optimizer.device if zero.offload_optimizer else "none",  # no section: none
        offload_param=zero.offload_param.device if zero.offload_param else "none",
        overlap_comm=zero.overlap_comm, reduce_bucket_size=zero.reduce_bucket_size,
        allgather_bucket_size=zero.allgather_bucket_size, gradient_clipping=cfg.gradient_clipping,
        **(_zeropp(zero, cfg.batch.dp) if zero.stage == 3 else {}))


def _zeropp(zero, dp: int) -> dict:
    """ZeRO++'s Plan fields from zero_optimization; hpZ's size as DeepSpeed takes it, min(size, dp)
    (utils/groups.py, ``_create_zero_param_parallel_group``)."""
    g = zero.zero_hpz_partition_size
    return dict(zero_quantized_weights=zero.zero_quantized_weights, zero_quantized_gradients=zero.zero_quantized_gradients,
                zero_hpz_partition_size=min(g, dp) if g > 1 else g)
