"""Explorers for a notebook: ipywidgets controls that re-simulate and redraw one figure in place.

    from sim.views import widgets
    widgets.explore("gpt3-175b", tp=8, pp=16, dp=8, microbatches=64)   # a whole training step
    widgets.pipeline_explorer()                                         # just the pipeline schedule

Everything they compute is a plain function here — ``explorer_inputs`` (controls → Model,
Cluster, Plan), ``explorer_result`` (→ SimResult), ``summary_text`` (→ the text shown) and
``pipeline_result`` — so a test drives an explorer without a browser: set a control's ``value``,
read ``summary.value`` or the figure. An update re-simulates, redraws the figure's axes (the
figure and its Image widget are made once) and replaces the PNG the Image shows. Graphs are kept
small enough for a slider (``NODE_BUDGET`` nodes: layers are merged into groups) and the Gantt
chart shows at most ``MAX_ROWS`` rows. ipywidgets and matplotlib are imported only by the classes.
"""
from __future__ import annotations

import inspect
import io
import threading
from statistics import fmean

from sim.cost.costs import Costs
from sim.spec.hardware import GPUS, Cluster
from sim.spec.model import MODELS, Model
from sim.spec.plan import Plan
from sim.step.graph import STREAMS
from sim.step.idle import CAUSE_LABELS, CAUSES
from sim.step.pipeline import bubble_fraction
from sim.step.simulate import SimResult, simulate
from sim.views import render

# Widget callbacks can run on several threads at once: JupyterLab 4.6 sends comm messages to kernel
# subshells, and ipykernel 7 handles each subshell on its own thread. matplotlib (pyplot's figure list,
# one Figure drawn twice at once) is not thread-safe, so every redraw in the course takes this lock
# (course.widgets.interactive too): two updates draw one after the other, never into each other.
DRAW_LOCK = threading.RLock()
NODE_BUDGET = 3000
MAX_ROWS = 16
OFFLOAD = {"none": ("none", "none"), "optimizer → CPU": ("cpu", "none"), "optimizer → NVMe": ("nvme", "none"),
           "optimizer + params → CPU": ("cpu", "cpu"), "optimizer + params → NVMe": ("nvme", "nvme")}
POW2 = [1, 2, 4, 8, 16, 32, 64]


def explorer_inputs(model="gpt3-175b", gpu="A100-80GB", zero_stage=1, tp=8, pp=16, dp=8, schedule="1f1b",
                    virtual=1, microbatches=64, offload="none", recompute="full", micro_batch_size=1):
    """(Model, Cluster, Plan) for the explorer's settings: ``tp·pp·dp`` GPUs, 8 per node."""
    if offload not in OFFLOAD:
        raise ValueError(f"offload must be one of {', '.join(map(repr, OFFLOAD))}, got {offload!r}")
    opt, param = OFFLOAD[offload]
    plan = Plan(zero_stage=zero_stage, tp=tp, pp=pp, dp=dp, micro_batch_size=micro_batch_size,
                num_microbatches=microbatches, schedule=schedule, virtual=virtual if schedule == "interleaved" else 1,
                recompute=recompute, offload_optimizer=opt, offload_param=param)
    world = plan.world_size
    if world > 8 and world % 8:
        raise ValueError(f"tp × pp × dp = {world} GPUs: above 8 it must fill whole 8-GPU nodes")
    cluster = Cluster.preset(gpu, nodes=max(1, world // 8), gpus_per_node=min(8, world))
    return Model.preset(model), cluster, plan


_DEFAULTS = {k: p.default for k, p in inspect.signature(explorer_inputs).parameters.items()}


def granularity_for(model: Model, plan: Plan, budget: int = NODE_BUDGET):
    """The finest layer grouping (layers per node) that keeps the graph under ``budget`` nodes."""
    per_chunk = model.layers // (plan.pp * plan.virtual)
    ops = 2 * plan.pp * plan.virtual * plan.num_microbatches
    per_group = 2 + (plan.tp > 1) + 3 * (plan.zero_stage == 3)
    for g in range(1, per_chunk + 1):
        if per_chunk % g == 0 and ops * (per_chunk // g) * per_group <= budget:
            return g
    return "stage"


def explorer_result(**settings) -> SimResult:
    """Simulate the explorer's settings (see ``explorer_inputs``) on a slider-sized graph."""
    model, cluster, plan = explorer_inputs(**settings)
    return simulate(model, cluster, plan, granularity=granularity_for(model, plan))


def summary_text(r: SimResult) -> str:
    """What the explorer prints: step, MFU, bubble (simulated and closed form), idle by cause, memory, fit."""
    pl, gib = r.plan, 2**30
    off = "none" if pl.offload_optimizer == "none" else f"optimizer → {pl.offload_optimizer}" + (
        f", params → {pl.offload_param}" if pl.offload_param != "none" else "")
    share = {c: fmean(r.idle[c]) / r.step_time if r.step_time else 0.0 for c in CAUSES}
    stage = max(range(pl.pp), key=lambda s: r.peak_memory[s]["total"])
    peak = r.peak_memory[stage]
    parts = ", ".join(f"{name} {peak[c] / gib:.1f}" for c, name in (
        ("param", "params"), ("grad", "grads"), ("optim", "optimizer"), ("activation", "activations"),
        ("zero3_gathered", "gathered"), ("comm_bucket", "buckets")) if peak[c])
    return "\n".join([
        f"{r.model.name} · {r.cluster.world_size} × {r.cluster.gpu.name} · TP {pl.tp} × "
        f"{f'CP {pl.cp} ({pl.cp_kind}) × ' if pl.cp > 1 else ''}PP {pl.pp} × DP {pl.dp} · "
        f"ZeRO-{pl.zero_stage} · {pl.schedule} m={pl.num_microbatches}{f' v={pl.virtual}' if pl.virtual > 1 else ''}"
        f" · recompute {pl.recompute} · offload {off}",
        f"step {r.step_time:.3f} s · {r.tflops_per_gpu:.1f} TFLOP/s per GPU · MFU {r.mfu:.1%} · bubble "
        f"{r.bubble_fraction:.1%} (closed form (p−1)/(vm+p−1) = {bubble_fraction(pl.pp, pl.num_microbatches, pl.virtual):.1%})",
        "idle, share of the step (mean over stages): " + ", ".join(f"{CAUSE_LABELS[c]} {share[c]:.1%}" for c in CAUSES),
        f"peak memory {peak['total'] / gib:.1f} GiB on stage {stage} ({parts}) of {r.cluster.gpu.hbm_bytes / gib:.0f} GiB"
        f" → {'fits' if r.fits else 'DOES NOT FIT'}",
    ])


def pipeline_result(stages=4, microbatches=8, schedule="1f1b", virtual=1) -> SimResult:
    """A pipeline alone: uniform stages, free communication (t_B = 2 t_F), one layer per model chunk."""
    v = virtual if schedule == "interleaved" else 1
    model = Model("pipeline", layers=stages * v, hidden=256, heads=8, vocab=1000, seq=128)
    plan = Plan(pp=stages, num_microbatches=microbatches, schedule=schedule, virtual=v)
    cluster = Cluster.preset("A100-80GB", nodes=stages, gpus_per_node=1)
    return simulate(model, cluster, plan, Costs.compute_only(), granularity="stage", head=False)


def pipeline_text(r: SimResult) -> str:
    pl = r.plan
    closed = bubble_fraction(pl.pp, pl.num_microbatches, pl.virtual)
    return (f"{pl.schedule}, p={pl.pp} stages, m={pl.num_microbatches} micro-batches"
            f"{f', v={pl.virtual} chunks' if pl.virtual > 1 else ''}: step {r.step_time / _unit(r):.0f} t_F, "
            f"bubble {r.bubble_fraction:.4f} simulated = {closed:.4f} closed form (p−1)/(vm+p−1)")


def _unit(r):
    """Seconds of one forward of one stage (all its chunks): the pipeline picture's time unit."""
    return r.busy["compute"][0] / (3 * r.plan.num_microbatches)


class _Explorer:
    """Controls + one Figure (drawn to PNG into one Image widget) + a summary; ``update()`` redraws."""

    def __init__(self, controls: dict, nrows: int, figsize):
        import ipywidgets as w
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.controls = controls
        self.figure = Figure(figsize=figsize, dpi=72)
        FigureCanvasAgg(self.figure)
        self.axes = [self.figure.add_subplot(nrows, 1, k + 1) for k in range(nrows)]
        # fixed margins (a layout engine would re-solve on every redraw): room for the row labels
        # on the left and the legends on the right
        self.figure.subplots_adjust(left=0.17, right=0.8, top=0.95, bottom=0.1, hspace=0.15 if nrows > 1 else 0)
        from matplotlib.ticker import MaxNLocator
        for ax in self.axes:
            ax.xaxis.set_major_locator(MaxNLocator(6))
            ax.yaxis.set_major_locator(MaxNLocator(5))
        self.image = w.Image(format="png")
        self.summary = w.HTML()
        self.result: SimResult | None = None
        self.error: str | None = None
        boxes = list(controls.values())
        self.ui = w.VBox([w.HBox(boxes[k:k + 4]) for k in range(0, len(boxes), 4)] + [self.summary, self.image])
        for c in boxes:
            c.observe(lambda _: self.update(), names="value")

    @property
    def settings(self) -> dict:
        return {k: c.value for k, c in self.controls.items()}

    def update(self) -> None:
        """Re-simulate with the controls' values and redraw in place (an invalid setting is shown, not raised)."""
        with DRAW_LOCK:
            self._update()

    def _update(self) -> None:
        try:
            self.result, self.error = self.compute(**self.settings), None
        except ValueError as e:
            self.error = str(e)
            self.summary.value = f"<pre style='color:#b00'>{_html(self.error)}</pre>"
            return
        self.summary.value = f"<pre>{_html(self.text(self.result))}</pre>"
        self.draw(self.result)  # sim.views.render replaces its own artists on these axes
        buf = io.BytesIO()
        self.figure.canvas.print_png(buf, pil_kwargs={"compress_level": 1})  # fast over small
        self.image.value = buf.getvalue()

    def _repr_mimebundle_(self, **kw):
        return self.ui._repr_mimebundle_(**kw)


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _gantt_rows(r: SimResult):
    """Every stage with every stream it uses when that fits MAX_ROWS rows, else compute rows only."""

    used = [STREAMS[k] for k in sorted(set(r.graph.stream))]
    stages = list(range(r.plan.pp))
    if len(stages) * len(used) <= MAX_ROWS:
        return stages, used
    if len(stages) > MAX_ROWS:
        stages = sorted({round(k * (len(stages) - 1) / (MAX_ROWS - 1)) for k in range(MAX_ROWS)})
    return stages, ["compute"]


class Explorer(_Explorer):
    """A whole training step: model, GPU, ZeRO stage, TP/PP/DP, schedule, micro-batches, offload, recompute."""

    def __init__(self, **settings):
        import ipywidgets as w

        unknown = set(settings) - set(_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown explorer setting(s) {', '.join(sorted(unknown))}; "
                             f"choose from {', '.join(_DEFAULTS)}")
        s = {**_DEFAULTS, **settings}
        drop = dict(layout=w.Layout(width="190px"), style={"description_width": "70px"})
        controls = {
            "model": w.Dropdown(options=list(MODELS), value=s["model"], description="model", **drop),
            "gpu": w.Dropdown(options=list(GPUS), value=s["gpu"], description="GPU", **drop),
            "zero_stage": w.Dropdown(options=[0, 1, 2, 3], value=s["zero_stage"], description="ZeRO", **drop),
            "recompute": w.Dropdown(options=["none", "selective", "full"], value=s["recompute"],
                                    description="recompute", **drop),
            "tp": w.Dropdown(options=POW2[:4], value=s["tp"], description="TP", **drop),
            "pp": w.Dropdown(options=POW2, value=s["pp"], description="PP", **drop),
            "dp": w.Dropdown(options=POW2 + [128, 256], value=s["dp"], description="DP", **drop),
            "offload": w.Dropdown(options=list(OFFLOAD), value=s["offload"], description="offload", **drop),
            "schedule": w.Dropdown(options=["gpipe", "1f1b", "interleaved"], value=s["schedule"],
                                   description="schedule", **drop),
            "virtual": w.Dropdown(options=[1, 2, 3, 4], value=s["virtual"], description="virtual", **drop),
            "microbatches": w.IntSlider(value=s["microbatches"], min=1, max=128, description="micro-batches",
                                        continuous_update=False, style={"description_width": "90px"}),
        }
        self.micro_batch_size = s["micro_batch_size"]
        super().__init__(controls, 2, (11, 6.5))
        self.update()

    def compute(self, **settings):
        return explorer_result(micro_batch_size=self.micro_batch_size, **settings)

    text = staticmethod(summary_text)

    def draw(self, r):

        stages, streams = _gantt_rows(r)
        gantt, mem = self.axes
        render.gantt(r, ax=gantt, stages=stages, streams=streams, labels=False)
        stage = max(range(r.plan.pp), key=lambda s: r.peak_memory[s]["total"])
        render.memory_stack(r, stage=stage, ax=mem, legend="short")
        # one time axis for both; every text costs ~1 ms to draw, so the summary carries the numbers
        mem.set_xlim(gantt.get_xlim())
        gantt.set_xlabel("")
        gantt.tick_params(labelbottom=False)
        gantt.set_title("")
        # 'stage 0' on compute rows, 'tp'/'dp'/... under them: a fifth of the glyphs of 'stage 0 · tp_comm'
        rows = [t.get_text().split(" · ") for t in gantt.get_yticklabels()]
        gantt.set_yticks(gantt.get_yticks(), [st if k == "compute" else k.replace("_comm", "") for st, k in rows])
        mem.set_title(f"stage {stage} memory", fontsize=9)


class PipelineExplorer(_Explorer):
    """Stages, micro-batches, schedule and virtual chunks: the Gantt chart and the measured bubble."""

    def __init__(self, stages=4, microbatches=8, schedule="1f1b", virtual=2):
        import ipywidgets as w

        controls = {
            "stages": w.IntSlider(value=stages, min=1, max=8, description="stages p"),
            "microbatches": w.IntSlider(value=microbatches, min=1, max=32, description="micro-batches m"),
            "schedule": w.Dropdown(options=["gpipe", "1f1b", "interleaved"], value=schedule, description="schedule"),
            "virtual": w.IntSlider(value=virtual, min=1, max=4, description="virtual v"),
        }
        super().__init__(controls, 1, (11, 3.5))
        self.update()

    compute = staticmethod(pipeline_result)
    text = staticmethod(pipeline_text)

    def draw(self, r):

        pl = r.plan
        render.gantt(r, ax=self.axes[0], streams=["compute"], labels=pl.pp * pl.num_microbatches * pl.virtual <= 48)


def explore(model="gpt3-175b", **settings) -> Explorer:
    """The whole-step explorer (settings as ``explorer_inputs``); display it as a cell's result."""
    return Explorer(model=model, **settings)


def pipeline_explorer(**settings) -> PipelineExplorer:
    """The pipeline-schedule explorer: stages, micro-batches, schedule, virtual chunks."""
    return PipelineExplorer(**settings)
