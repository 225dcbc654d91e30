"""Which of the four ideas a model needs on a cluster: the ZeRO / offload ladder, checked rung by rung.

Each rung trades speed for GPU memory, in the order DeepSpeed's users are told to climb
(HuggingFace Transformers' DeepSpeed guide: "speed-wise, left is faster: stage 0 (DDP) > 1 > 2 >
2 + offload > 3 > 3 + offloads"; memory the other way round):

    DDP (ZeRO-0) → ZeRO-1 → ZeRO-2 → ZeRO-2 + optimizer on the CPU (ZeRO-Offload) → ZeRO-3
    → ZeRO-3 + optimizer on the CPU → ZeRO-3 + optimizer and parameters on the CPU
    → ZeRO-3 + optimizer and parameters on NVMe (ZeRO-Infinity)

``ladder`` evaluates every rung for one model, cluster and tp × pp split (the GPUs left over are
data parallel): the GPU bytes a rank needs at least (sim.planning.bounds.memory_lower_bound: model states
+ activations in flight), the host memory and NVMe per node that the offloaded states take, and
— with ``simulate=True`` — the simulated peak and step time. ``recommend`` returns the first
rung that fits. With pipeline parallelism (pp > 1) DeepSpeed runs ZeRO-0 and ZeRO-1 only
(deepspeed/runtime/pipe/engine.py, PipelineEngine.__init__, 0.19.8: "ZeRO-2 and ZeRO-3 are
incompatible with pipeline parallelism"), so by default those rungs are listed as not allowed;
``framework="any"`` evaluates them as another framework (FSDP with pipelining) would run them.
Every rung runs DeepSpeed's collectives (sim.step.frameworks): ZeRO-1 and ZeRO-2 send 1.5× DDP's
bytes per step (an all-reduce of the gradients, then an all-gather of the parameters), not the ZeRO
paper's 1×, and the simulated step times include it. When even the last rung does not fit the GPU, what is left is the activations
of the layers one GPU runs: that is the fourth idea's job (tensor / sequence / pipeline
parallelism: raise tp or pp) or recomputation's.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.planning.bounds import memory_lower_bound
from sim.planning.search import granularity_for
from sim.spec.hardware import Cluster
from sim.spec.model import Model
from sim.spec.plan import Plan
from sim.step.simulate import simulate as run_simulation


@dataclass(frozen=True)
class Rung:
    name: str
    zero_stage: int
    offload_optimizer: str = "none"
    offload_param: str = "none"


RUNGS = (
    Rung("DDP (ZeRO-0)", 0), Rung("ZeRO-1", 1), Rung("ZeRO-2", 2),
    Rung("ZeRO-2 + opt→CPU (Offload)", 2, "cpu"), Rung("ZeRO-3", 3), Rung("ZeRO-3 + opt→CPU", 3, "cpu"),
    Rung("ZeRO-3 + opt,params→CPU", 3, "cpu", "cpu"), Rung("ZeRO-3 + opt,params→NVMe (Infinity)", 3, "nvme", "nvme"),
)


@dataclass
class Step:
    """One rung evaluated: its plan, bytes (GPU per rank; host and NVMe per node), verdicts, and the
    simulated peak / step time when simulated (else None)."""

    rung: Rung
    plan: Plan
    gpu_bytes: float
    cpu_bytes_per_node: float
    nvme_bytes_per_node: float
    fits_gpu: bool
    fits_cpu: bool
    fits_nvme: bool
    peak_bytes: float | None = None
    step_time: float | None = None
    allowed: bool = True  # False: the framework cannot run this rung with this split

    @property
    def fits(self) -> bool:
        return self.allowed and self.fits_gpu and self.fits_cpu and self.fits_nvme


def cluster_of(gpu: str, gpus: int, **overrides) -> Cluster:
    """``gpus`` GPUs of a preset, 8 per node (fewer on one node)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}")
    if gpus > 8 and gpus % 8:
        raise ValueError(f"{gpus} GPUs: above 8 they must fill whole 8-GPU nodes")
    return Cluster.preset(gpu, nodes=max(1, gpus // 8), gpus_per_node=min(8, gpus), **overrides)


def ladder(model: Model, cluster: Cluster, *, tp: int = 1, pp: int = 1, micro_batch_size: int = 1,
           num_microbatches: int = 1, recompute: str = "full", precision: str | None = None,
           memory_fraction: float = 0.9, simulate: bool = False, costs=None, framework: str = "deepspeed",
           attention: str = "eager") -> list[Step]:
    """Every rung of ``RUNGS`` for ``model`` on ``cluster`` split tp × pp × (the rest data parallel).

    A rung fits when its GPU bytes are at most ``memory_fraction`` × HBM (the simulated peak
    when ``simulate``, else the lower bound) and its offloaded states fit the nodes' host memory
    and NVMe, and the ``framework`` ('deepspeed' or 'any') can run it.
    """
    if framework not in ("deepspeed", "any"):
        raise ValueError(f"framework must be 'deepspeed' or 'any', got {framework!r}")
    if cluster.world_size % (tp * pp):
        raise ValueError(f"{cluster.world_size} GPUs do not split into tp {tp} × pp {pp}")
    dp = cluster.world_size // (tp * pp)
    precision = precision or ("bf16" if cluster.gpu.bf16 else "fp16")
    limit, gpn = memory_fraction * cluster.gpu.hbm_bytes, cluster.gpus_per_node
    steps = []
    for rung in RUNGS:
        plan = Plan(zero_stage=rung.zero_stage, tp=tp, pp=pp, dp=dp, micro_batch_size=micro_batch_size,
                    num_microbatches=num_microbatches, recompute=recompute, precision=precision,
                    sequence_parallel=tp > 1, offload_optimizer=rung.offload_optimizer,
                    offload_param=rung.offload_param, attention=attention)
        need = memory_lower_bound(model, plan)
        step = Step(rung, plan, need["total"], need["cpu"] * gpn, need["nvme"] * gpn, need["total"] <= limit,
                    need["cpu"] * gpn <= cluster.cpu_bytes, need["nvme"] * gpn <= cluster.nvme_bytes,
                    allowed=framework == "any" or pp == 1 or rung.zero_stage <= 1)
        if simulate and step.allowed:
            r = run_simulation(model, cluster, plan, costs, granularity=granularity_for(model, plan))
            step.peak_bytes, step.step_time = r.peak_gpu_bytes, r.step_time
            step.fits_gpu = r.peak_gpu_bytes <= limit
        steps.append(step)
    return steps


def recommend(model: Model, cluster: Cluster, **kw) -> Step | None:
    """The first rung of ``ladder(model, cluster, **kw)`` that fits, or None (then raise tp / pp)."""
    return next((s for s in ladder(model, cluster, **kw) if s.fits), None)


def ladder_table(steps: list[Step], cluster: Cluster, memory_fraction: float = 0.9) -> str:
    """The ladder as text: GPU GiB per rank, host GiB and NVMe TB per node, verdicts, simulated time."""
    gib = 2**30
    lines = [f"{'rung':<37}{'GPU GiB':>8}{'host GiB/node':>14}{'NVMe TB/node':>13}  fits"
             + ("   step s" if any(s.step_time is not None for s in steps) else "")]
    first = next((s for s in steps if s.fits), None)
    for s in steps:
        gpu = s.peak_bytes if s.peak_bytes is not None else s.gpu_bytes
        why = "yes" if s.fits else "no: " + ", ".join(
            w for w, ok in (("DeepSpeed pp", s.allowed), ("GPU", s.fits_gpu), ("host", s.fits_cpu),
                            ("NVMe", s.fits_nvme)) if not ok)
        mark = " ←" if s is first else ""
        time = f"{s.step_time:9.3f}" if s.step_time is not None else ""
        lines.append(f"{s.rung.name:<37}{gpu / gib:8.1f}{s.cpu_bytes_per_node / gib:14.0f}"
                     f"{s.nvme_bytes_per_node / 1e12:13.2f}  {why:<13}{time}{mark}")
    lines.append(f"limits: GPU {memory_fraction * cluster.gpu.hbm_bytes / gib:.0f} GiB usable of {cluster.gpu.hbm_bytes / gib:.0f}, "
                 f"host {cluster.cpu_bytes / gib:.0f} GiB and NVMe {cluster.nvme_bytes / 1e12:.0f} TB per node")
    return "\n".join(lines)
