"""Search the plan space for the fastest configuration that fits: an auto-tuner on the simulator.

    from sim.planning import search
    result = search.search(sim.Model.preset("gpt3-175b"), sim.Cluster.preset("A100-80GB", nodes=128),
                           global_batch=1536, costs=sim.calibration.calibrate.calibrate())
    print(result.table())          # ranked: step time, TFLOP/s per GPU, MFU, peak memory
    result.best.plan               # a sim.Plan

Three steps.

1. Enumerate (``Space``): tp divides the heads (and the key/value groups) and fits in a node
   unless ``Space.tp`` names larger degrees, pp divides the layers,
   cp splits long sequences (``Space.cp``: ring attention where the sequence splits into 2·cp
   zig-zag chunks, Ulysses where the heads per TP rank divide by cp), dp = world / (tp·cp·pp);
   ZeRO stage 0–3; a micro-batch size, with the accumulation steps
   (= pipeline micro-batches) that reach the global batch; 1F1B, or interleaved (v chunks per
   stage) where the framework has it; recomputation none / selective / full; sequence parallelism;
   offload options. By default only what DeepSpeed 0.19.8 runs, with its collectives: 1F1B only,
   ZeRO-2 and ZeRO-3 only without pipeline parallelism. ``Space.framework`` 'megatron' plans Megatron-Core's (stages 0–1, its
   distributed optimizer with overlap_param_gather), 'fsdp2' torch's fully_shard (stage 3 with any pp, reshard after
   forward or not), 'any' DeepSpeed's collectives with every stage and pp (sim.step.frameworks).
2. Prune with the static memory model (sim.planning.bounds.memory_lower_bound: model states + the
   activations and buffers stage 0 provably holds). A plan whose *lower bound* exceeds the
   memory limit cannot fit, so it is rejected without simulating it; the table says why.
3. Simulate the rest, cheapest lower bound on step time first (sim.planning.bounds.time_lower_bound).
   With ``top=k``, stop once the next plan's time bound is above the k-th fastest plan that
   fits: no plan left can enter the top k (branch and bound). ``top=None`` simulates them all.
   With ``pareto=True``, also simulate every plan that no simulated fitting plan beats on both
   bounds (time and memory), so that the Pareto front of step time against peak memory is complete.

The memory limit is ``memory_fraction`` × the GPU's HBM (default 0.9: the CUDA context, the
allocator's fragmentation and buffers the simulator does not model need the rest), and the
host tiers must hold what is offloaded to them (per node).
"""
from __future__ import annotations

import gettext
import itertools
import time
from dataclasses import dataclass, field, replace

from sim.cost.cost_model import CostModel
from sim.planning.bounds import memory_lower_bound, time_lower_bound
from sim.spec.hardware import Cluster
from sim.spec.model import Model
from sim.spec.plan import CP_KINDS, Plan
from sim.step.simulate import simulate

GiB = 2**30
OFFLOADS = (("none", "none"), ("cpu", "none"), ("cpu", "cpu"), ("nvme", "nvme"))
LONG_SEQUENCE = 8192  # the default search tries cp > 1 from this sequence length on
SPACE_FRAMEWORKS = ("deepspeed", "megatron", "fsdp2", "any")
NODE_BUDGET = 12_000  # task-graph nodes per simulated plan (sets the granularity, see granularity_for)


@dataclass(frozen=True)
class Space:
    """The choices to enumerate; None for tp / pp means every valid degree."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    # Pipeline schedules; None: the framework's. DeepSpeed 0.19.8's PipelineEngine._train_schedule
    # (deepspeed/runtime/pipe/engine.py) always builds schedule.TrainSchedule, 1F1B with one chunk per
    # stage; Megatron-Core and torch.distributed.pipelining also interleave (v chunks per stage).
    schedules: tuple[str, ...] | None = None
    virtual: tuple[int, ...] = (2, 3, 4)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    sequence_parallel: tuple[bool, ...] = (False, True)  # True: where tp > 1
    offload: tuple[tuple[str, str], ...] = OFFLOADS  # (offload_optimizer, offload_param)
    precision: str | None = None                  # None: bf16 where the GPU has it, else fp16
    gradient_clipping: float = 1.0
    attention: str = "eager"                    # every plan's attention ('flash' for today's runs)
    # Context-parallel degrees; None: 1, and from LONG_SEQUENCE tokens on every power of two the
    # model and the world allow. ``cp_kinds`` None: the framework's (DeepSpeed 0.19.8 ships Ulysses,
    # deepspeed/sequence/layer.py DistributedAttention, and no ring attention; Megatron-Core's
    # context_parallel_size and torch's context_parallel run ring attention; 'any': both).
    cp: tuple[int, ...] | None = None
    cp_kinds: tuple[str, ...] | None = None
    # Which framework must be able to run the plan. 'deepspeed': DeepSpeed 0.19.8's
    # PipelineEngine.__init__ (deepspeed/runtime/pipe/engine.py) asserts
    # zero_optimization_stage() < ZeroStageEnum.gradients, "ZeRO-2 and ZeRO-3 are incompatible
    # with pipeline parallelism", so with pp > 1 the stage is at most 1 (Megatron's distributed
    # optimizer is stage 1 too). 'megatron': stages 0–1 with Megatron-Core's collectives; 'fsdp2':
    # stage 3 with FSDP2's, with any pp (torchtitan pipelines it); 'any': every stage with every pp,
    # DeepSpeed's collectives. Plan.framework of each plan is the framework ('deepspeed' for 'any').
    framework: str = "deepspeed"
    # The highest ZeRO stage allowed together with pp > 1; None: the framework's (1 or 3).
    max_zero_with_pp: int | None = None
    # DeepSpeed ZeRO-3 on several nodes: also try ZeRO++ (sim.step.zeropp) with hpZ over the data-parallel
    # ranks of a node: hpZ alone (exact), and qwZ + hpZ + qgZ (quantized). It triples the multi-node ZeRO-3
    # plans; their time bounds (each group's first gather of a step from the primary, the rest in the node; the
    # (de)quantize kernels on the compute stream) skip most of them (``python -m sim plan --no-zeropp``: without).
    zeropp: bool = True

    def __post_init__(self):
        if self.framework not in SPACE_FRAMEWORKS:
            raise ValueError(f"Space.framework must be one of {', '.join(map(repr, SPACE_FRAMEWORKS))}, "
                             f"got {self.framework!r}")
        if self.cp_kinds is not None and (not self.cp_kinds or set(self.cp_kinds) - set(CP_KINDS)):
            raise ValueError(f"Space.cp_kinds must name some of {CP_KINDS}, got {self.cp_kinds!r}")
        if self.attention not in ("eager", "flash"):
            raise ValueError(f"Space.attention must be 'eager' or 'flash', got {self.attention!r}")
        if self.max_zero_with_pp is not None and self.max_zero_with_pp not in (0, 1, 2, 3):
            raise ValueError(f"Space.max_zero_with_pp must be 0-3 or None, got {self.max_zero_with_pp!r}")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The cp kinds to search."""
        return self.cp_kinds or {"deepspeed": ("ulysses",), "megatron": ("ring",), "fsdp2": ("ring",)}.get(
            self.framework, CP_KINDS)

    @property
    def pipeline_schedules(self) -> tuple[str, ...]:
        """The schedules to search."""
        if self.schedules is not None:
            return self.schedules
        return ("1f1b",) if self.framework == "deepspeed" else ("1f1b", "interleaved")

    @property
    def zero_with_pp(self) -> int:
        """The highest ZeRO stage a plan with pp > 1 may use."""
        if self.max_zero_with_pp is not None:
            return self.max_zero_with_pp
        return 1 if self.framework == "deepspeed" else 3

    @property
    def plan_framework(self) -> str:
        """Plan.framework of the plans: whose collectives they issue."""
        return "deepspeed" if self.framework == "any" else self.framework

    def allows(self, zero: int, offload: tuple[str, str]) -> bool:
        """Whether the framework runs ZeRO ``zero`` with ``offload`` (offload_optimizer, offload_param)."""
        if self.framework == "megatron":
            return zero <= 1 and offload == ("none", "none")
        if self.framework == "fsdp2":
            return zero == 3 and offload == ("none", "none")
        return True


@dataclass
class Row:
    """One enumerated plan and what became of it.

    ``status``: 'fits' (simulated, fits), 'oom' (simulated, peak over the limit), 'pruned' (its
    memory lower bound is over the limit: not simulated), 'skipped' (its step-time lower bound
    is above the top-k, and with ``pareto`` a simulated plan is at least as fast and as small as its
    bounds: not simulated). Times in seconds, memory in bytes.
    """

    plan: Plan
    status: str
    memory_bound: float
    time_bound: float
    granularity: int
    step_time: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    bubble: float | None = None
    peak_bytes: float | None = None
    reason: str = ""

    @property
    def fits(self) -> bool:
        return self.status == "fits"


@dataclass
class SearchResult:
    """Rows ranked (fitting plans by step time first), the limits, and what the search did."""

    model: Model
    cluster: Cluster
    global_batch: int
    memory_limit: float
    rows: list[Row]
    stats: dict = field(default_factory=dict)

    @property
    def feasible(self) -> list[Row]:
        return [r for r in self.rows if r.fits]

    @property
    def best(self) -> Row:
        return self.feasible[0]

    def pareto_front(self) -> list[Row]:
        """The fitting plans no other simulated plan beats on both step time and peak memory."""
        return pareto_front(self.rows)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.rows)

    def table(self, n: int = 10, rejected: int = 3) -> str:
        """The ``n`` fastest plans that fit, then ``rejected`` examples of each way a plan failed."""
        s = self.stats
        lines = [_("{model} on {world} × {gpu}, global batch {batch}, limit {limit:.1f} GiB: {enumerated} plans, "
                   "{pruned} pruned by the memory model, {simulated} simulated ({oom} over the limit), "
                   "{skipped} skipped by the time bound").format(
                     model=self.model.name, world=self.cluster.world_size, gpu=self.cluster.gpu.name,
                     batch=self.global_batch, limit=self.memory_limit / GiB, **s),
                 f"{'#':>3} {_('plan'):<52} {_('step s'):>8} {'TFLOP/s':>7} {'MFU':>6} {_('bubble'):>6} "
                 f"{_('peak GiB'):>8}"]
        for i, r in enumerate(self.feasible[:n], 1):
            lines.append(f"{i:>3} {describe(r.plan):<52} {r.step_time:8.3f} {r.tflops_per_gpu:7.1f} "
                         f"{r.mfu:6.1%} {r.bubble:6.1%} {r.peak_bytes / GiB:8.1f}")
        for status in ("oom", "pruned"):
            for r in [r for r in self.rows if r.status == status][:rejected]:
                lines.append(f"  ✗ {describe(r.plan):<52} {r.reason}")
        return "\n".join(lines)


def _(message: str) -> str:  # gettext: a Chinese-edition kernel binds the catalog (course/i18n.py)
    return gettext.dgettext("zero_lab", message)


def describe(plan: Plan) -> str:
    """A short name: 'tp8 pp16 dp8 Z1 mbs1 m192 1f1b rc=sel sp' ('tp8 cp2u ...': cp 2 Ulysses; 'cp2r': ring;
    ZeRO++: ' qwZ hpZ8 qgZ')."""
    sched = f"int{plan.virtual}" if plan.schedule == "interleaved" else plan.schedule
    rc = {"none": "", "selective": " rc=sel", "full": " rc=full"}[plan.recompute]
    off = "" if plan.offload_optimizer == "none" else f" off={plan.offload_optimizer}"
    off += "" if plan.offload_param == "none" else f"+param:{plan.offload_param}"
    fw = {"deepspeed": "", "zero_ref": " zero_ref",
          "megatron": " megatron" + (" overlap-gather" if plan.overlap_param_gather else ""),
          "fsdp2": " fsdp2" + ("" if plan.reshard_after_forward else " keep")}[plan.framework]
    cp = f" cp{plan.cp}{plan.cp_kind[0]}" if plan.cp > 1 else ""
    fw += "".join(name for name, on in ((" qwZ", plan.zero_quantized_weights), (f" hpZ{plan.hpz}", plan.hpz > 1),
                                        (" qgZ", plan.zero_quantized_gradients)) if on)
    return (f"tp{plan.tp}{cp} pp{plan.pp} dp{plan.dp} Z{plan.zero_stage} mbs{plan.micro_batch_size} "
            f"m{plan.num_microbatches} {sched}{rc}{' sp' if plan.sequence_parallel else ''}{off}{fw}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def context_degrees(model: Model, tp: int, world: int, space: Space) -> list[tuple[int, str]]:
    """(cp, cp_kind) pairs to try with ``tp``: cp = 1, and each cp > 1 of ``space`` the model splits into."""
    if space.cp is None:
        cps = [c for c in _divisors(world // tp) if c > 1 and c & (c - 1) == 0] if model.seq >= LONG_SEQUENCE else []
    else:
        cps = [c for c in space.cp if c > 1 and (world // tp) % c == 0]
    out = [(1, "ring")] if space.cp is None or 1 in space.cp else []
    for c in cps:
        for kind in space.kinds:
            if kind == "ring" and model.seq % (2 * c) == 0 or kind == "ulysses" and (
                    model.heads // tp) % c == 0 and (model.key_value_heads // tp) % c == 0:
                out.append((c, kind))
    return out


def enumerate_plans(model: Model, cluster: Cluster, global_batch: int, space: Space | None = None) -> list[Plan]:
    """Every plan of ``space`` on ``cluster`` whose batch arithmetic works out (global_batch =
    micro-batch × micro-batches × dp), in a fixed order."""
    space = space or Space()
    world, gpn = cluster.world_size, cluster.gpus_per_node
    precision = space.precision or ("bf16" if cluster.gpu.bf16 else "fp16")
    # TP within a node unless the space names the degrees; whole heads and key/value groups per rank
    tps = [t for t in (space.tp or _divisors(gpn)) if model.heads % t == 0 and model.key_value_heads % t == 0
           and (t <= gpn or space.tp is not None) and world % t == 0]
    pps = [p for p in (space.pp or _divisors(model.layers)) if model.layers % p == 0]
    plans = []
    for tp, pp in itertools.product(tps, pps):
        for cp, kind in context_degrees(model, tp, world, space):
            plans += _plans_of(model, space, world, tp, cp, kind, pp, global_batch, precision)
    return [v for plan in plans for v in zeropp_variants(plan, gpn, space)]


def zeropp_variants(plan: Plan, gpus_per_node: int, space: Space) -> list[Plan]:
    """``plan``, and for a DeepSpeed ZeRO-3 plan whose data parallelism spans nodes its ZeRO++ versions:
    hpZ over the node's data-parallel ranks (gpus_per_node // tp), alone and with qwZ and qgZ."""
    g = gpus_per_node // plan.tp
    n = plan.dp * plan.cp
    if not space.zeropp or plan.framework != "deepspeed" or plan.zero_stage != 3 or g < 2 or n <= g or n % g:
        return [plan]
    return [plan, replace(plan, zero_hpz_partition_size=g),
            replace(plan, zero_hpz_partition_size=g, zero_quantized_weights=True, zero_quantized_gradients=True)]


def _plans_of(model, space, world, tp, cp, kind, pp, global_batch, precision) -> list[Plan]:
    """The plans of one (tp, cp, cp_kind, pp) in ``space``."""
    plans = []
    if world % (tp * cp * pp) == 0:
        dp = world // (tp * cp * pp)
        for mbs in space.micro_batch_sizes:
            if global_batch % (dp * mbs):
                continue
            m = global_batch // (dp * mbs)
            names = space.pipeline_schedules
            schedules = [("1f1b", 1)] if "1f1b" in names or pp == 1 else []
            if "interleaved" in names and pp > 1 and m % pp == 0:
                schedules += [("interleaved", v) for v in space.virtual if model.layers % (pp * v) == 0]
            if "zb-h1" in names and pp > 1:  # opt-in: Space(schedules=("1f1b", "zb-h1"))
                schedules.append(("zb-h1", 1))
            sps = sorted({sp and tp > 1 for sp in space.sequence_parallel})  # SP needs a TP group
            for (schedule, v), zero, rc, sp, (off_opt, off_par) in itertools.product(
                    schedules, space.zero_stages, space.recompute, sps, space.offload):
                if (off_opt != "none" and zero == 0) or (off_par != "none" and zero != 3) \
                        or (off_opt == "nvme" and zero != 3) or (pp > 1 and zero > space.zero_with_pp) \
                        or not space.allows(zero, (off_opt, off_par)):
                    continue
                # FSDP2: reshard after forward (ZeRO-3's traffic) or keep the units (ZeRO-2-like memory)
                for reshard in ((True, False) if space.framework == "fsdp2" else (True,)):
                    plans.append(Plan(zero_stage=zero, tp=tp, pp=pp, dp=dp, micro_batch_size=mbs,
                                      num_microbatches=m, schedule=schedule, virtual=v, recompute=rc,
                                      sequence_parallel=sp, precision=precision, offload_optimizer=off_opt,
                                      offload_param=off_par, gradient_clipping=space.gradient_clipping,
                                      attention=space.attention, cp=cp, cp_kind=kind,
                                      framework=space.plan_framework, reshard_after_forward=reshard,
                                      overlap_param_gather=space.framework == "megatron" and zero == 1))
    return plans


def granularity_for(model: Model, plan: Plan, node_budget: int = NODE_BUDGET) -> int:
    """Layers per graph node: the finest split of a model chunk whose graph stays within ``node_budget``
    nodes (sim.step.lowering's 'auto' rule with a smaller budget, so a search can afford many plans)."""
    per_chunk = model.layers // (plan.pp * plan.virtual)
    z3 = plan.zero_stage == 3 and (plan.dp * plan.cp > 1 or plan.offload_param != "none")
    ops, per_group = 2 * plan.pp * plan.virtual * plan.num_microbatches, 2 + (plan.tp > 1) + 3 * z3
    per_group += 4 * plan.cp + 6 if plan.cp > 1 else 0  # the attention blocks and cp transfers
    for g in _divisors(per_chunk):
        if ops * (per_chunk // g) * per_group <= node_budget:
            return g
    return per_chunk


class NoPlanFits(ValueError):
    """No enumerated plan fits in memory; ``smallest`` is the least GPU memory any plan needs (bytes)."""

    def __init__(self, message: str, smallest: float):
        super().__init__(message)
        self.smallest = smallest


def _host_reason(cluster: Cluster, need: dict) -> str:
    gpn = cluster.gpus_per_node
    if need["cpu"] * gpn > cluster.cpu_bytes:
        return f"host memory {need['cpu'] * gpn / GiB:.0f} GiB per node > {cluster.cpu_bytes / GiB:.0f} GiB"
    if need["nvme"] * gpn > cluster.nvme_bytes:
        return f"NVMe {need['nvme'] * gpn / 1e12:.1f} TB per node > {cluster.nvme_bytes / 1e12:.1f} TB"
    return ""


def search(model: Model, cluster: Cluster, global_batch: int, space: Space | None = None, costs=None, *,
           top: int | None = 10, pareto: bool = False, memory_fraction: float = 0.9,
           node_budget: int = NODE_BUDGET) -> SearchResult:
    """Rank the plans of ``space`` for ``model`` on ``cluster`` at ``global_batch`` sequences per step.

    ``costs``: the cost model's constants (e.g. sim.calibration.calibrate.calibrate()); ``top``: simulate until
    the ``top`` fastest fitting plans are certain (None: every plan that passes the memory prune);
    ``pareto``: and until the step-time / peak-memory Pareto front is certain (``pareto_front``).
    Raises ValueError when the batch splits no way, NoPlanFits when nothing fits.
    """
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch must be a positive integer, got {global_batch!r}")
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise ValueError(f"top must be a positive integer or None, got {top!r}")
    t0 = time.perf_counter()
    space = space or Space()
    plans = enumerate_plans(model, cluster, global_batch, space)
    if not plans:
        dps = sorted({cluster.world_size // (t * p) for t in _divisors(cluster.gpus_per_node)
                      for p in _divisors(model.layers) if cluster.world_size % (t * p) == 0})
        raise ValueError(f"global_batch {global_batch} does not split as micro-batch "
                         f"{space.micro_batch_sizes} × micro-batches × dp on {cluster.world_size} GPUs "
                         f"(dp can be {dps}); choose a multiple of dp × micro-batch")
    limit = memory_fraction * cluster.gpu.hbm_bytes
    rows, candidates, cost_models = [], [], {}
    for plan in plans:
        need = memory_lower_bound(model, plan)
        g = granularity_for(model, plan, node_budget)
        row = Row(plan, "pruned", need["total"], 0.0, g)
        rows.append(row)
        reason = _host_reason(cluster, need)
        if need["total"] > limit:
            reason = (f"needs ≥ {need['total'] / GiB:.2f} GiB (states {need['states'] / GiB:.1f} + activations "
                      f"{need['activations'] / GiB:.1f} + buffers {need['transient'] / GiB:.1f}), "
                      f"{(need['total'] - limit) / 2**20:,.0f} MiB over")
        if reason:
            row.reason = reason
            continue
        # all a CostModel's links and rates depend on (ZeRO-3's data-parallel collectives have their own efficiency)
        key = (plan.tp, plan.cp, plan.pp, plan.dp, plan.precision, plan.zero_stage == 3, plan.hpz)
        if key not in cost_models:
            cost_models[key] = CostModel(cluster, plan, costs)
        row.time_bound = time_lower_bound(model, cluster, plan, costs, granularity=g, cost_model=cost_models[key])
        row.status = "skipped"
        candidates.append(row)
    candidates.sort(key=lambda r: (r.time_bound, r.memory_bound, describe(r.plan)))
    best_times: list[float] = []  # step times of fitting plans, sorted
    front: list[Row] = []         # the Pareto front so far (with ``pareto``)
    for row in candidates:
        if top is not None and len(best_times) >= top and row.time_bound > best_times[top - 1]:
            dominated = next((f for f in front if f.step_time <= row.time_bound and f.peak_bytes <= row.memory_bound),
                             None) if pareto else True
            if dominated is not None:
                row.reason = f"step ≥ {row.time_bound:.3f} s > the {top}th best {best_times[top - 1]:.3f} s" + (
                    f"; ≥ {describe(dominated.plan)} in time and memory" if pareto else "")
                continue
        r = simulate(model, cluster, row.plan, costs, granularity=row.granularity)
        row.step_time, row.tflops_per_gpu, row.mfu = r.step_time, r.tflops_per_gpu, r.mfu
        row.bubble, row.peak_bytes = r.bubble_fraction, r.peak_gpu_bytes
        if r.peak_gpu_bytes <= limit:
            row.status = "fits"
            best_times.append(r.step_time)
            best_times.sort()
            if pareto:
                front = pareto_front(front + [row])
        else:
            row.status = "oom"
            row.reason = (f"simulated peak {r.peak_gpu_bytes / GiB:.2f} GiB, "
                          f"{(r.peak_gpu_bytes - limit) / 2**20:,.0f} MiB over")
    order = {"fits": 0, "oom": 1, "skipped": 2, "pruned": 3}
    rows.sort(key=lambda r: (order[r.status], r.step_time or 0.0, r.time_bound, r.memory_bound, describe(r.plan)))
    stats = {"enumerated": len(rows), "pruned": sum(r.status == "pruned" for r in rows),
             "simulated": sum(r.status in ("fits", "oom") for r in rows),
             "oom": sum(r.status == "oom" for r in rows), "skipped": sum(r.status == "skipped" for r in rows),
             "seconds": time.perf_counter() - t0}
    result = SearchResult(model, cluster, global_batch, limit, rows, stats)
    if not result.feasible:
        need = lambda r: r.peak_bytes if r.peak_bytes is not None else r.memory_bound
        which = min(rows, key=need)
        smallest = need(which)
        where = (f"the smallest any of the {len(rows)} plans needs is {smallest / GiB:.1f} GiB"
                 if smallest > limit else "plans that fit the GPU run out of host memory or NVMe")
        raise NoPlanFits(f"no plan fits in {limit / GiB:.1f} GiB per GPU ({memory_fraction:.0%} of "
                         f"{cluster.gpu.name}): {where} ({describe(which.plan)}: {which.reason}); add GPUs, "
                         f"offload, or shrink the micro-batch", smallest)
    return result


def pareto_front(rows: list[Row]) -> list[Row]:
    """The simulated plans that fit and that no other beats on both step time and peak memory,
    fastest first."""
    front, best_peak = [], float("inf")
    for r in sorted((r for r in rows if r.fits), key=lambda r: (r.step_time, r.peak_bytes)):
        if r.peak_bytes < best_peak:
            front.append(r)
            best_peak = r.peak_bytes
    return front
