"""Calibrate the simulator on real zero_ref runs on this machine, then predict other configurations.

Validation rung 4 (sim_anchors): the simulator against real runs, side by side. The machine is a
host whose "GPUs" are CPU processes talking gloo over loopback; ``zero_ref.profiling.profile.measure``
measures it and returns plain numbers, which this module (torch-free) turns into a ``sim.Cluster``
and ``sim.Costs``:

    the machine     a rank's GEMM FLOP/s → GPU.peak_flops; its element-wise bytes/s → GPU.hbm_bw;
                    the loopback link's α and bandwidth from the collective sweep (``fit_alpha_beta``)
                    → Costs.alpha_nvlink and Cluster.nvlink_bw (one host: every group is "NVLink")
    fitted on ONE   efficiency           the share of the GEMM rate the forward + backward reach:
    configuration                        measured compute = FLOPs / (peak × eff) + element-wise
                                         bytes / hbm_bw, solved for eff (compute = phase − its comm)
                    adam_bytes_per_param the optimizer phase (minus its collectives) × hbm_bw / the
                                         parameters this rank updates
                    nvlink_efficiency    measured collective seconds in the step against the α-β
                                         model of the same calls at the sweep's bandwidth: the link
                                         as training sees it (cold buffers, the copies and sums)

Each constant comes from its own phase of the calibration run, so the "fit" is three solves. The
evidence is ``compare``: every other configuration, simulated with the same constants, against its
measured step time. Steps are timed on one of zero_ref.profiling.profile's two clocks (``basis``): 'cpu', the
CPU time the rank's process spends (default: the step's work, steady on a shared machine), or
'wall', the fastest step's wall clock.

The simulator's structure is that of a GPU step; how it differs from a CPU rank running zero_ref is
stated, not tuned away: on a CPU rank a collective and the compute share the cores (the plans here
have overlap_comm off, so the sim keeps the reduce-scatters on the critical path, but it still
overlaps ZeRO-3's prefetched gathers with compute); gloo runs reduce_scatter as an all-reduce (its
trace shows ``gloo:all_reduce``), which the ring formula charges half; zero_ref's ZeRO-3 adds small
header all-gathers that check every rank runs the same collectives (zero_ref.stages.zero3.path_check:
before each one until a micro-step's order repeats, then one per micro-step) and Python hooks per
module.

    import zero_ref.profiling.profile as zp, sim.calibration.fit_local as fl
    m = zp.measure({"zero1": zp.StepSpec(1, 4), "zero2 mb8": zp.StepSpec(2, 8)}, 2)
    fit = fl.fit_local(m, calibration="zero1")
    print(fl.table(fl.compare(fit, m)))
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from sim.cost.collectives import all_gather, reduce_scatter, ring_all_reduce
from sim.cost.costs import Costs
from sim.cost.work import Adam, Collective, Compute
from sim.spec.hardware import GPU, Cluster
from sim.spec.model import Model
from sim.spec.plan import Plan
from sim.step.graph import KINDS, STREAMS
from sim.step.lowering import build_graph
from sim.step.simulate import SimResult, simulate

GiB = 2**30


# ---------------------------------------------------------------- the alpha-beta fit of a link


def alpha_beta_terms(op: str, nbytes: float, n: int) -> tuple[float, float]:
    """(latency steps k, wire bytes w) of a ring collective: its time is k·α + w/B (sim.cost's formulas)."""
    if n < 2:
        return 0.0, 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes
    if op in ("reduce_scatter", "all_gather"):
        return float(n - 1), (n - 1) / n * nbytes
    if op == "broadcast":
        return float(n - 1), float(nbytes)
    raise ValueError(f"no alpha-beta model for collective {op!r}")


def collective_time(op: str, nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """Seconds of one ring collective under the alpha-beta model (= sim.cost's ring formulas)."""
    if op == "all_reduce":
        return ring_all_reduce(nbytes, n, alpha, bandwidth)
    if op in ("reduce_scatter", "all_gather"):
        return (reduce_scatter if op == "reduce_scatter" else all_gather)(nbytes, n, alpha, bandwidth)
    k, w = alpha_beta_terms(op, nbytes, n)
    return k * alpha + w / bandwidth


@dataclass(frozen=True)
class AlphaBeta:
    """A link fitted to measured collectives: latency ``alpha`` (s per ring step), ``bandwidth``
    (bytes/s), and the samples' relative errors (predicted / measured − 1)."""

    alpha: float
    bandwidth: float
    ops: tuple[str, ...]
    errors: tuple[float, ...] = field(default=(), repr=False)

    def time(self, op: str, nbytes: float, n: int) -> float:
        return collective_time(op, nbytes, n, self.alpha, self.bandwidth)


def _rows(samples, ops):
    rows = [s for s in samples if ops is None or s["op"] in ops]
    if not rows:
        raise ValueError(f"no samples for ops {ops}; samples have {sorted({s['op'] for s in samples})}")
    for s in rows:
        if not s["seconds"] > 0:
            raise ValueError(f"sample {s} has no positive 'seconds'")
    return rows


def fit_alpha_beta(samples, ops=None) -> AlphaBeta:
    """Fit t = k·α + w/B to samples [{"op", "bytes", "group_size", "seconds"}] (``ops``: which to use).

    Least squares on *relative* error (each row divided by its measured time), so a 4 KiB call,
    almost all latency, weighs as much as a 16 MiB one, almost all bandwidth. α and 1/B stay ≥ 0
    (a negative one is set to 0 and the other refitted)."""
    rows = _rows(samples, ops)
    terms = np.array([alpha_beta_terms(s["op"], s["bytes"], s["group_size"]) for s in rows])
    t = np.array([s["seconds"] for s in rows])
    A = terms / t[:, None]
    x = np.linalg.lstsq(A, np.ones(len(t)), rcond=None)[0]
    if x[0] < 0 or x[1] <= 0:  # one parameter at its bound: refit the other alone
        j = 1 if x[0] < 0 else 0
        x = np.zeros(2)
        x[j] = max(0.0, float(A[:, j] @ np.ones(len(t)) / (A[:, j] @ A[:, j])))
    if x[1] <= 0:
        raise ValueError("the samples do not determine a bandwidth: include sizes where bytes dominate")
    pred = terms @ x
    return AlphaBeta(float(x[0]), float(1 / x[1]), tuple(sorted({s["op"] for s in rows})),
                     tuple(float(e) for e in pred / t - 1))


# ---------------------------------------------------------------- the machine, the model, the plan


def host_cluster(machine: dict, world_size: int, link: AlphaBeta, *, share_cores: bool = True) -> Cluster:
    """``world_size`` CPU ranks on this host as a sim.Cluster: one node, a "GPU" per rank whose peak is
    the measured GEMM rate and whose memory bandwidth is the measured element-wise rate, NVLink = the
    loopback link. Measured with ``machine['world_size']`` ranks on ``machine['cores']`` cores; with
    more ranks than cores each rank gets cores/ranks of a core in wall time, so with ``share_cores``
    both rates are scaled by that share (not on the CPU-time clock, where a rank's work is its own)."""
    for key in ("gemm_flops", "memory_bw", "cores", "world_size"):
        if key not in machine:
            raise ValueError(f"machine needs {key!r} (from zero_ref.profiling.profile.measure); got {sorted(machine)}")
    share = lambda w: min(1.0, machine["cores"] / w) if share_cores else 1.0
    scale = share(world_size) / share(machine["world_size"])
    ram = machine.get("memory_bytes", 8 * GiB)
    gpu = GPU("cpu-rank", machine["gemm_flops"] * scale, ram / world_size, machine["memory_bw"] * scale, bf16=False)
    return Cluster(gpu, nodes=1, gpus_per_node=world_size, nvlink_bw=link.bandwidth, pcie_bw=machine["memory_bw"],
                   ib_bw=link.bandwidth, cpu_bytes=ram)


def gpt_model(cfg: dict, name: str = "course-gpt") -> Model:
    """The sim.Model of a zero_ref GPTConfig (fields as a dict); Ψ agrees with GPTConfig.num_params."""
    return Model(name, layers=cfg["n_layers"], hidden=cfg["d_model"], heads=cfg["n_heads"], vocab=cfg["vocab_size"],
                 seq=cfg["seq_len"], ffn=cfg.get("ffn_mult", 4) * cfg["d_model"], bias=cfg.get("bias", True),
                 tied=cfg.get("tie_embeddings", True), positions="learned")


def plan_for(step: dict) -> Plan:
    """The sim.Plan of a measured zero_ref step: zero_ref's collectives, fp32, dp = world size, no overlap
    (zero_ref.profiling.profile runs overlap_comm=False); stages 1–3 all-reduce the gradient norm (zero_ref always does), stage 0 does not."""
    return Plan(zero_stage=step["stage"], dp=step["world_size"], micro_batch_size=step["micro_batch"],
                num_microbatches=step["gas"], precision="fp32", overlap_comm=False, framework="zero_ref",
                gradient_clipping=1.0 if step["stage"] >= 1 else 0.0)


def work_totals(model: Model, plan: Plan) -> dict:
    """What one rank's zero_ref step holds, summed from the sim's task graph: GEMM FLOPs, element-wise
    bytes, parameters Adam updates, and the collectives [(op, bytes, axis)] in order. The steps this
    module fits on are zero_ref's, whose stages issue the ZeRO paper's collectives, so a plan with
    DeepSpeed's (the default) is booked with zero_ref's (``Plan.framework`` 'zero_ref')."""
    if plan.framework == "deepspeed":
        plan = replace(plan, framework="zero_ref")
    g = build_graph(model, plan, granularity="layer")
    out = {"flops": 0.0, "elementwise_bytes": 0.0, "adam_params": 0.0, "collectives": []}
    for w in g.work:
        work = g.works[w]
        if isinstance(work, Compute):
            out["flops"] += work.flops
            out["elementwise_bytes"] += work.hbm_bytes
        elif isinstance(work, Adam) and work.on == "gpu":
            out["adam_params"] += work.params
        elif isinstance(work, Collective) and work.op != "p2p":
            out["collectives"] += [(work.op, work.nbytes, work.axis)] * work.count
    return out


# ---------------------------------------------------------------- the fit


@dataclass
class LocalFit:
    """Constants fitted on one measured configuration: ``costs`` and ``link`` with the ``machine`` and
    ``model`` they describe; ``values`` the fitted numbers; ``calibration`` the configuration's name,
    ``basis`` the clock it was timed on."""

    costs: Costs
    link: AlphaBeta
    machine: dict
    model: Model
    values: dict
    calibration: str
    basis: str = "cpu"

    def cluster(self, world_size: int) -> Cluster:
        return host_cluster(self.machine, world_size, self.link, share_cores=self.basis == "wall")

    def simulate(self, step: dict) -> SimResult:
        """The simulated step of a measured (or described) configuration: a dict with stage,
        micro_batch, gas, world_size (as ``zero_ref.profiling.profile.measure`` returns)."""
        plan = plan_for(step)
        return simulate(self.model, self.cluster(plan.world_size), plan, self.costs, granularity="layer")

    def predict(self, step: dict) -> float:
        return self.simulate(step).step_time


BASES = ("cpu", "wall")


def _phase(view: dict, name: str) -> float:
    return view[name] - view["comm"][name]


def _basis(basis: str) -> str:
    if basis not in BASES:
        raise ValueError(f"basis must be one of {', '.join(BASES)} (zero_ref.profiling.profile's clocks), "
                         f"got {basis!r}")
    return basis


def fit_local(measured: dict, calibration: str, *, basis: str = "cpu", link_ops=None) -> LocalFit:
    """Fit the cost constants on ``measured['steps'][calibration]`` (see the module docstring), timed
    on ``basis`` 'cpu' (the CPU time of the step: its work, what an unshared machine takes) or
    'wall' (the fastest step's wall clock). ``link_ops``: which collectives of the sweep fit the link."""
    steps = measured.get("steps", {})
    if calibration not in steps:
        raise ValueError(f"calibration {calibration!r} is not among the measured steps: {', '.join(steps)}")
    step, machine = steps[calibration], measured["machine"]
    view = step[_basis(basis)]
    link = fit_alpha_beta(measured["sweep"], link_ops)
    model = gpt_model(measured["model"])
    plan = plan_for(step)
    totals = work_totals(model, plan)
    cluster = host_cluster(machine, plan.world_size, link, share_cores=basis == "wall")
    peak, mem_bw = cluster.gpu.peak_flops, cluster.gpu.hbm_bw

    compute = _phase(view, "forward") + _phase(view, "backward")
    gemm = compute - totals["elementwise_bytes"] / mem_bw
    if gemm <= 0:
        raise ValueError(f"{calibration}: measured compute {compute:.4f} s is below the element-wise kernels' "
                         f"{totals['elementwise_bytes'] / mem_bw:.4f} s at the measured memory bandwidth")
    efficiency = totals["flops"] / (peak * gemm)

    optimizer = _phase(view, "optimizer")
    if not optimizer > 0 or not totals["adam_params"]:
        raise ValueError(f"{calibration}: no optimizer time to fit ({optimizer!r} s)")
    adam_bytes = optimizer * mem_bw / totals["adam_params"]

    calls = [c for c in view["collectives"] if not c["async"]]
    values = {"efficiency": efficiency, "adam_bytes_per_param": adam_bytes, "nvlink_efficiency": 1.0,
              "alpha": link.alpha, "bandwidth": link.bandwidth}
    # (on the cpu basis a collective's seconds are the copies and sums it costs, not the waiting)
    if calls:
        steps_alpha = sum(alpha_beta_terms(c["op"], c["bytes"], c["group_size"])[0] for c in calls) * link.alpha
        wire = sum(alpha_beta_terms(c["op"], c["bytes"], c["group_size"])[1] for c in calls)
        seconds = sum(c["seconds"] for c in calls)
        if seconds <= steps_alpha or wire <= 0:
            raise ValueError(f"{calibration}: its collectives ({seconds:.4f} s) leave no time for bandwidth "
                             f"after the sweep's latency ({steps_alpha:.4f} s)")
        values["nvlink_efficiency"] = wire / (link.bandwidth * (seconds - steps_alpha))
    costs = Costs(efficiency=efficiency, elementwise_traffic=1.0, hbm_efficiency=1.0,
                  nvlink_efficiency=values["nvlink_efficiency"], ib_efficiency=values["nvlink_efficiency"],
                  alpha_nvlink=link.alpha, alpha_ib=link.alpha, adam_bytes_per_param=adam_bytes)
    return LocalFit(costs, link, dict(machine), model, values, calibration, basis)


# ---------------------------------------------------------------- simulated vs measured


@dataclass(frozen=True)
class Comparison:
    """One configuration: measured and simulated step time (s) and the error (simulated / measured − 1)."""

    name: str
    measured: float
    predicted: float
    calibration: bool

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


def compare(fit: LocalFit, measured: dict, names=None) -> list[Comparison]:
    """Simulate every measured configuration (or ``names``) with ``fit``'s constants, against its step
    time on the clock ``fit`` was fitted on."""
    steps = measured["steps"]
    names = list(steps) if names is None else list(names)
    return [Comparison(n, steps[n][fit.basis]["step"], fit.predict(steps[n]), n == fit.calibration) for n in names]


def table(rows: list[Comparison]) -> str:
    lines = [f"{'configuration':<16}{'measured ms':>12}{'simulated ms':>13}{'error':>8}"]
    for r in rows:
        lines.append(f"{r.name:<16}{r.measured * 1e3:>12.1f}{r.predicted * 1e3:>13.1f}{r.error:>+8.1%}"
                     + ("  (fitted on)" if r.calibration else ""))
    return "\n".join(lines)


_PHASE = {"forward": "forward", "backward": "backward", "optimizer": "optimizer"}


def sim_spans(result: SimResult, stage: int = 0) -> list[dict]:
    """A simulated step as [{"name", "track", "start", "end"}] (seconds), in the form of
    ``zero_ref.profiling.torch_trace.trace_spans``: compute-stream work on the 'compute' track under its phase
    (forward, backward, optimizer), each collective on the 'comm' track under its op name."""
    g, out = result.graph, []
    for i in range(len(g)):
        if g.stage[i] != stage:
            continue
        work = g.works[g.work[i]]
        stream = STREAMS[g.stream[i]]
        start, end = float(result.start[i]), float(result.end[i])
        if stream == "compute":
            name = "optimizer" if isinstance(work, Adam) else KINDS[g.kind[i]]
            out.append({"name": _PHASE.get(name, name), "track": "compute", "start": start, "end": end})
        elif isinstance(work, Collective):
            out.append({"name": work.op, "track": "comm", "start": start, "end": end})
    return sorted(out, key=lambda s: (s["start"], s["track"]))
