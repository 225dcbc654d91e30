"""How a model is trained on a cluster: a ``Plan`` (parallel degrees, ZeRO, schedule, batch, precision).

A frozen dataclass that checks each field on construction and names the bad one.
``Plan.from_deepspeed(config, world_size, tp, pp)`` reads a DeepSpeed config dict, resolving the
batch keys exactly as DeepSpeed does (zero_ref.config.batch.resolve_batch_sizes).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from zero_ref.config.batch import resolve_batch_sizes
from zero_ref.memory import RECIPES, ALIASES
from sim.config import one_of, positive_int

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "cpu", "nvme")


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
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    gradient_clipping: float = 1.0

    def __post_init__(self):
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ValueError(f"Plan.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        for f in ("tp", "pp", "dp", "micro_batch_size", "num_microbatches", "virtual",
                  "reduce_bucket_size", "allgather_bucket_size"):
            positive_int("Plan", f, getattr(self, f))
        one_of("Plan", "schedule", self.schedule, SCHEDULES)
        one_of("Plan", "recompute", self.recompute, RECOMPUTE)
        one_of("Plan", "precision", self.precision, tuple(RECIPES) + tuple(ALIASES))
        one_of("Plan", "offload_optimizer", self.offload_optimizer, OFFLOAD)
        one_of("Plan", "offload_param", self.offload_param, OFFLOAD)
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
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro_batch_size × num_microbatches × dp."""
        return self.micro_batch_size * self.num_microbatches * self.dp

    @classmethod
    def from_deepspeed(cls, config: dict, world_size: int, tp: int = 1, pp: int = 1, **overrides) -> "Plan":
        """A Plan from a DeepSpeed config dict on ``world_size`` GPUs split tp × pp × dp.

        Reads the batch keys (DeepSpeed's arithmetic: train_batch_size = micro × accumulation × dp,
        with the micro-batches forming the pipeline), bf16/fp16, zero_optimization (stage,
        overlap_comm, bucket sizes, offload_optimizer/offload_param devices) and gradient_clipping.
        ``overrides`` set fields DeepSpeed's config does not hold (schedule, virtual, recompute,
        sequence_parallel).
        """
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        positive_int("from_deepspeed", "world_size", world_size)
        positive_int("from_deepspeed", "tp", tp)
        positive_int("from_deepspeed", "pp", pp)
        if world_size % (tp * pp):
            raise ValueError(f"world_size {world_size} is not divisible by tp × pp = {tp} × {pp}")
        dp = world_size // (tp * pp)
        batch = resolve_batch_sizes(config.get("train_batch_size"), config.get("train_micro_batch_size_per_gpu"),
                                    config.get("gradient_accumulation_steps"), dp=dp)
        bf16, fp16 = (_section(config, k).get("enabled", False) for k in ("bf16", "fp16"))
        if bf16 and fp16:
            raise ValueError("bf16.enabled and fp16.enabled are both true; enable one")
        zero = _section(config, "zero_optimization")
        stage = zero.get("stage", 0)
        if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
            raise ValueError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
        kw = dict(
            zero_stage=stage, tp=tp, pp=pp, dp=dp,
            micro_batch_size=batch.train_micro_batch_size_per_gpu,
            num_microbatches=batch.gradient_accumulation_steps,
            precision="bf16" if bf16 else "fp16" if fp16 else "fp32",
            offload_optimizer=_device(zero, "offload_optimizer"),
            offload_param=_device(zero, "offload_param"),
            overlap_comm=_flag(zero, "overlap_comm", stage == 3),
            reduce_bucket_size=_count(zero, "reduce_bucket_size", 500_000_000),
            allgather_bucket_size=_count(zero, "allgather_bucket_size", 500_000_000),
            # DeepSpeed 0.19.8's code default (its older docs say 0): clipping on unless the config says 0.
            gradient_clipping=config.get("gradient_clipping", 1.0),
        )
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown Plan field(s): {', '.join(sorted(unknown))}")
        return cls(**{**kw, **overrides})

    def to_deepspeed(self, *, nvme_path: str = "/local_nvme", **extra) -> dict:
        """This plan as a DeepSpeed config dict: the inverse of ``from_deepspeed``.

        The config holds the batch keys (train_batch_size = micro-batch × accumulation steps × dp,
        the accumulation steps being the pipeline's micro-batches), bf16/fp16, zero_optimization
        and gradient_clipping. The rest of a plan is not in a DeepSpeed config: tp and pp belong to
        the launcher and the model (Megatron's mpu, DeepSpeed's PipelineModule), recompute,
        sequence_parallel, schedule and virtual to the model code. So
        ``Plan.from_deepspeed(plan.to_deepspeed(), plan.world_size, plan.tp, plan.pp, recompute=...,
        sequence_parallel=..., schedule=..., virtual=...) == plan``. NVMe offload writes ``nvme_path``;
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


def _section(config: dict, key: str) -> dict:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be a dict, got {value!r}")
    return value


def _device(zero: dict, key: str) -> str:
    section = zero.get(key) or {}
    if not isinstance(section, dict):
        raise ValueError(f"zero_optimization.{key} must be a dict, got {section!r}")
    device = section.get("device", "none") or "none"
    if device not in OFFLOAD:
        raise ValueError(f"zero_optimization.{key}.device must be 'none', 'cpu' or 'nvme', got {device!r}")
    return device


def _flag(zero: dict, key: str, default: bool) -> bool:
    value = zero.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"zero_optimization.{key} must be true or false, got {value!r}")
    return value


def _count(zero: dict, key: str, default: int) -> int:
    value = zero.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1 or value != int(value):
        raise ValueError(f"zero_optimization.{key} must be a positive whole number, got {value!r}")
    return int(value)
