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

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("eager", "flash")
OFFLOAD = ("none", "cpu", "nvme")
CP_KINDS = ("ring", "ulysses")
KERNELS = ("fused", "eager")
FRAMEWORKS = ("deepspeed", "megatron", "fsdp2")
_DEEPSPEED = ds_config.Config()  # DeepSpeed's defaults, for the knobs a Plan shares with its config


@dataclass(frozen=True)
class Plan:
    """One training configuration: tp × pp × dp ranks, ZeRO ``zero_stage``, and the step's schedule.

    Each step runs ``num_microbatches`` micro-batches of ``micro_batch_size`` sequences per pipeline
    (DeepSpeed's gradient_accumulation_steps); the global batch is micro_batch_size ×
    num_microbatches × dp. ``schedule`` 'interleaved' splits each stage into ``virtual`` chunks.
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
    ``kernels``: 'fused' (Megatron's and Transformer Engine's fused kernels, torch.compile) or 'eager' (PyTorch eager, one kernel per op:
    more element-wise bytes, ``Costs.eager_traffic``). ``fp8``: the GEMMs run in FP8 (Transformer
    Engine, torchao's Float8 linears) at ``Costs.fp8_efficiency`` of the FP8 peak; attention, the
    element-wise kernels, the collectives and the memory stay as ``precision`` says.
    ``recompute_gemms``: the share of each layer's projection GEMMs its backward runs again besides
    ``recompute`` (per-op selective checkpointing, sim.cost.flops.op_sac_share; its memory is not modelled).
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
    kernels: str = "fused"
    framework: str = "deepspeed"
    reshard_after_forward: bool = True
    fp8: bool = False
    recompute_gemms: float = 0.0

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
        one_of("Plan", "framework", self.framework, FRAMEWORKS)
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
        that zero_ref does not run but DeepSpeed accepts (ZeRO++, another optimizer, a monitor, ...)
        are accepted and do not change the plan. The plan takes the batch, the precision,
        zero_optimization's stage, overlap_comm, bucket sizes and offload devices, and
        gradient_clipping. ``overrides`` set fields DeepSpeed's config does not hold (schedule,
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
        precision = ALIASES.get(self.precision, self.precision)
        if precision not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"Plan.precision {self.precision!r} has no DeepSpeed config of its own "
                             "(bf16.enabled, fp16.enabled or neither); use 'bf16', 'fp16' or 'fp32'")
        zero = {"stage": self.zero_stage, "overlap_comm": self.overlap_comm,
                "reduce_bucket_size": self.reduce_bucket_size, "allgather_bucket_size": self.allgather_bucket_size}
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
        allgather_bucket_size=zero.allgather_bucket_size, gradient_clipping=cfg.gradient_clipping)
