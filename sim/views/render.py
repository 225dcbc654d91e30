"""Pictures of a simulated step (matplotlib, imported only when a function is called).

    from sim.views import render
    render.gantt(result)                   # one row per (stage, stream): who works when
    render.memory_stack(result, stage=0)   # bytes held over the step, stacked by category
    render.bubble_bars()                   # the pipeline bubble over micro-batches, for p and v
    render.idle_bars(result)               # each stage's idle time by cause, beside the closed form

Each takes an optional ``ax`` and returns the Axes it drew on (``ax.figure`` is the figure); none
calls ``plt.show()``. Calling ``gantt`` or ``memory_stack`` again on the same Axes replaces what the
previous call drew and keeps the Axes (its ticks are not rebuilt, which is most of a redraw's
cost), so a slider redraws in place. The Gantt chart draws each stream kind with one ``PolyCollection`` (one
artist for thousands of bars, so a slider-driven redraw stays fast); its bars span exactly the
events' start and end. The memory plot uses torch.profiler's memory-timeline colours
(sim_anchors §2): parameters darkgreen, optimizer states goldenrod, temporaries mediumpurple,
activations red, gradients mediumblue; gathered ZeRO-3 parameters are parameters (darkgreen,
lighter), communication buckets temporaries.
"""
from __future__ import annotations

import gettext

import numpy as np

from sim.step.graph import KINDS, STREAMS
from sim.step.idle import CAUSE_LABELS, CAUSES
from sim.step.pipeline import bubble_fraction, bubble_overhead

STREAM_COLORS = {"compute": "tab:blue", "tp_comm": "tab:orange", "dp_comm": "tab:green",
                 "pp_comm": "tab:purple", "h2d": "tab:brown", "d2h": "sienna", "nvme": "tab:olive",
                 "cpu": "tab:gray", "cp_comm": "tab:red"}
KIND_COLORS = {"forward": "#9ecae1", "backward": "#3182bd", "attention": "#6baed6", "weight_grad": "#08519c",
               "optimizer": "#636363"}  # on the compute row
# torch.profiler._memory_profiler's _CATEGORY_TO_COLORS, by the sim category each one stands for
MEMORY_COLORS = {"param": "darkgreen", "zero3_gathered": "darkgreen", "optim": "goldenrod",
                 "comm_bucket": "mediumpurple", "activation": "red", "grad": "mediumblue"}
MEMORY_ORDER = ("param", "zero3_gathered", "optim", "comm_bucket", "activation", "grad")  # bottom to top
TORCH_NAMES = {"param": "PARAMETER", "zero3_gathered": "PARAMETER (gathered, ZeRO-3)",
               "optim": "OPTIMIZER_STATE", "comm_bucket": "TEMPORARY (comm bucket)",
               "activation": "ACTIVATION", "grad": "GRADIENT"}
IDLE_COLORS = {"fill_drain": "#bdbdbd", "p2p_wait": "tab:purple", "exposed_comm": "tab:green",
               "offload_stall": "tab:brown", "memory_wait": "red"}
MAX_LABELS = 400  # 'auto' labels micro-batches when there are at most this many ops to label


def _(message: str) -> str:  # gettext: a Chinese-edition kernel binds the catalog (course/i18n.py)
    return gettext.dgettext("zero_lab", message)


def _axes(ax, figsize, replace: bool = False):
    if ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=figsize)
    elif replace:  # remove what an earlier gantt/memory_stack drew here, and only that
        for artist in getattr(ax, "_sim_drawn", ()):
            artist.remove()
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if replace:
        ax._sim_before = set(ax.collections) | set(ax.texts) | set(ax.lines)
    return ax


def _remember(ax):
    """Note the artists this call added, for the next call on the same Axes to replace."""
    ax._sim_drawn = [a for a in (*ax.collections, *ax.texts, *ax.lines) if a not in ax._sim_before]


def gantt(result, ax=None, stages=None, streams=None, labels="auto", height=0.8):
    """One row per (stage, stream) that has work, bars from each event's start to its end.

    ``stages``: which pipeline stages (default all); ``streams``: which streams (default every
    stream with an event on the shown stages). Compute bars are coloured by kind (forward light,
    backward dark, optimizer grey), communication by stream. ``labels``: write each forward /
    backward op's micro-batch ('F3', 'B3'; '.c1' for chunk 1 when interleaved) over its span —
    True, False, or 'auto' (when there are at most MAX_LABELS ops, on spans at least 1/60 of the
    step wide so that the labels do not overlap). Returns the Axes; its
    collections are one PolyCollection per stream, in ``STREAMS`` order.
    """
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    g, start, end = result.graph, np.asarray(result.start), np.asarray(result.end)
    stage, stream, kind = np.asarray(g.stage), np.asarray(g.stream), np.asarray(g.kind)
    stages = list(range(g.stages)) if stages is None else list(stages)
    for s in stages:
        if not 0 <= s < g.stages:
            raise ValueError(f"stage {s} is not in [0, {g.stages})")
    shown = np.isin(stage, stages)
    wanted = [STREAMS.index(s) for s in (streams or STREAMS) if s in STREAMS]
    if streams is not None and len(wanted) != len(streams):
        raise ValueError(f"streams must be among {', '.join(STREAMS)}, got {streams!r}")
    used = [k for k in wanted if (shown & (stream == k)).any()] if streams is None else wanted
    rows = [(s, k) for s in stages for k in used]
    row_of = {r: n for n, r in enumerate(rows)}
    ax = _axes(ax, (12, 0.45 * len(rows) + 1.5), replace=True)

    for k in used:
        idx = np.flatnonzero(shown & (stream == k))
        y = np.array([row_of[(s, k)] for s in stage[idx]], dtype=float)
        x0, x1, lo, hi = start[idx], end[idx], y - height / 2, y + height / 2
        verts = np.stack([np.column_stack(p) for p in ((x0, lo), (x0, hi), (x1, hi), (x1, lo))], axis=1)
        if STREAMS[k] == "compute":
            colors = [KIND_COLORS.get(KINDS[c], STREAM_COLORS["compute"]) for c in kind[idx]]
        else:
            colors = STREAM_COLORS[STREAMS[k]]
        # a thin edge in the face colour keeps sub-pixel events (short collectives) visible
        ax.add_collection(PolyCollection(verts, facecolors=colors, edgecolors="face", linewidths=0.4,
                                         label=STREAMS[k]))

    spans = _op_spans(result, stages)
    if labels == "auto":
        wide = result.step_time / 60
        spans = {k: v for k, v in spans.items() if v[1] - v[0] >= wide} if len(spans) <= MAX_LABELS else {}
    if labels:
        compute = STREAMS.index("compute")
        for (s, phase, mb, chunk), (a, b) in spans.items():
            text = f"{phase}{mb}" + (f".c{chunk}" if g.virtual > 1 else "")
            ax.text((a + b) / 2, row_of[(s, compute)], text, ha="center", va="center", fontsize=7,
                    color="black" if phase == "F" else "white", clip_on=True)

    ax.set_yticks(range(len(rows)), [f"stage {s} · {STREAMS[k]}" for s, k in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, result.step_time * 1.01 if result.step_time > 0 else 1)
    ax.set_xlabel("time (s)")
    ax.set_title(f"{result.plan.schedule} · p={result.plan.pp} m={result.plan.num_microbatches}"
                 f"{f' v={result.plan.virtual}' if result.plan.virtual > 1 else ''} · step "
                 f"{result.step_time:.3g} s · bubble {result.bubble_fraction:.1%}")
    handles = [Patch(color=KIND_COLORS[k], label=k) for k in ("forward", "backward")] + [
        Patch(color=STREAM_COLORS[STREAMS[k]], label=STREAMS[k]) for k in used if STREAMS[k] != "compute"]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    _remember(ax)
    return ax


def _op_spans(result, stages) -> dict[tuple, list[float]]:
    """(stage, 'F'|'B'|'W', micro-batch, chunk) -> [start of its first compute node, end of its last]."""
    g, want = result.graph, set(stages)
    phase = {KINDS.index("forward"): "F", KINDS.index("backward"): "B", KINDS.index("weight_grad"): "W"}
    spans: dict[tuple, list[float]] = {}
    for i in range(len(g)):
        if g.kind[i] in phase and g.stage[i] in want:
            key = (g.stage[i], phase[g.kind[i]], g.mb[i], g.chunk[i])
            span = spans.setdefault(key, [float(result.start[i]), float(result.end[i])])
            span[1] = float(result.end[i])
    return spans


def memory_stack(result, stage=0, ax=None, tier="gpu", unit=2**30, legend="full"):
    """Bytes one stage holds over the step on ``tier``, stacked by category (torch's colours).

    The timeline is a step function (it changes only at events), drawn as such up to the end of
    the step; a dashed line marks the peak and, on the GPU, the device's capacity when it is
    within 1.5× of the peak. ``unit``: bytes per y unit (GiB). ``legend``: 'full' (each category with
    torch's name for it), 'short' (the sim's names: fewer glyphs to draw, for sliders) or None.
    Returns the Axes.
    """
    if tier not in ("gpu", "cpu", "nvme"):
        raise ValueError(f"tier must be 'gpu', 'cpu' or 'nvme', got {tier!r}")
    if not 0 <= stage < result.memory.stages:
        raise ValueError(f"stage {stage} is not in [0, {result.memory.stages})")
    ax = _axes(ax, (10, 4), replace=True)
    times, curves = result.memory.curve(stage, tier)
    t_end = max(result.step_time, float(times[-1]) if len(times) else 0.0)
    x = np.append(np.repeat(times, 2)[1:], t_end)          # step function: hold each value until the next event
    cats = [c for c in MEMORY_ORDER if curves[c].any()] or ["param"]
    ys = [np.repeat(curves[c], 2) / unit for c in cats]
    polys = ax.stackplot(x, *ys, colors=[MEMORY_COLORS[c] for c in cats],
                         labels=[c if legend == "short" else f"{c} ({TORCH_NAMES[c]})" for c in cats],
                         linewidth=0)
    for c, p in zip(cats, polys):
        if c == "zero3_gathered":
            p.set_alpha(0.45)
    peak = result.memory.peak(stage, tier)["total"] / unit
    ax.axhline(peak, color="black", linestyle="--", linewidth=0.8, label=_("peak {peak:.2f}").format(peak=peak))
    top = peak
    if tier == "gpu" and result.cluster.gpu.hbm_bytes / unit <= 1.5 * peak:
        top = result.cluster.gpu.hbm_bytes / unit
        ax.axhline(top, color="grey", linestyle=":", label=_("HBM capacity"))
    ax.set_xlim(0, t_end if t_end > 0 else 1)
    ax.set_ylim(0, max(peak, top) * 1.05 if max(peak, top) > 0 else 1)
    ax.set_xlabel(_("time (s)"))
    ax.set_ylabel(_("{tier} memory ({unit})").format(tier=_({"gpu": "HBM", "cpu": "host", "nvme": "NVMe"}[tier]),
                  unit="GiB" if unit == 2**30 else f"× {unit:g} B"))
    ax.set_title(_("stage {stage}: memory by category ({tier})").format(stage=stage, tier=tier))
    if legend:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    _remember(ax)
    return ax


def bubble_bars(stages=(4, 8), microbatches=(1, 2, 4, 8, 16, 32), virtual=(1, 2), ax=None, kind="fraction",
                results=()):
    """Pipeline bubble vs micro-batches: one bar per (p, v) in each group of m, from the closed form.

    ``kind`` 'fraction': idle share of the step, (p − 1)/(v·m + p − 1); 'overhead': idle time over
    compute, (p − 1)/(v·m) (Megatron's "bubble time fraction"). Interleaving (v > 1) needs m to be
    a multiple of p; those bars are left out. ``results``: SimResults whose measured bubble is
    marked (black diamond) over their (p, v, m) bar — where the formula stops holding. Returns the Axes.
    """
    if kind not in ("fraction", "overhead"):
        raise ValueError(f"kind must be 'fraction' or 'overhead', got {kind!r}")
    formula = bubble_fraction if kind == "fraction" else bubble_overhead
    combos = [(p, v) for p in stages for v in virtual]
    ax = _axes(ax, (10, 4))
    width = 0.8 / len(combos)
    xpos = {}
    for n, (p, v) in enumerate(combos):
        xs, hs = [], []
        for j, m in enumerate(microbatches):
            if v > 1 and m % p:
                continue
            xs.append(j - 0.4 + (n + 0.5) * width)
            hs.append(formula(p, m, v))
            xpos[(p, v, m)] = xs[-1]
        ax.bar(xs, hs, width=width, label=f"p={p}" + (f", v={v}" if v > 1 else ""))
    for r in results:
        key = (r.plan.pp, r.plan.virtual, r.plan.num_microbatches)
        if key in xpos:
            value = r.bubble_fraction if kind == "fraction" else r.bubble_fraction / (1 - r.bubble_fraction)
            ax.plot(xpos[key], value, marker="D", color="black", linestyle="none")
    ax.set_xticks(range(len(microbatches)), [str(m) for m in microbatches])
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction (p−1)/(vm+p−1)" if kind == "fraction" else "bubble overhead (p−1)/(vm)")
    ax.legend(fontsize=8, frameon=False)
    return ax


def idle_bars(result, ax=None):
    """One stacked bar per stage: its compute stream's idle share of the step by cause (sim.step.idle),
    with a dashed line at the closed-form bubble (p − 1)/(v·m + p − 1) — where the bars rise above
    it, something other than the pipeline's fill and drain is idling the GPU. Returns the Axes."""

    ax = _axes(ax, (8, 3.5))
    pl, step = result.plan, result.step_time or 1.0
    stages = np.arange(pl.pp)
    bottom = np.zeros(pl.pp)
    for c in CAUSES:
        share = result.idle[c] / step
        if share.any():
            ax.bar(stages, share, bottom=bottom, color=IDLE_COLORS[c], label=CAUSE_LABELS[c])
            bottom += share
    closed = bubble_fraction(pl.pp, pl.num_microbatches, pl.virtual)
    ax.axhline(closed, color="black", linestyle="--", linewidth=0.8, label=f"(p−1)/(vm+p−1) = {closed:.3f}")
    ax.set_xticks(stages, [str(s) for s in stages])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("idle share of the step")
    ax.set_title(f"idle by cause · bubble {result.bubble_fraction:.1%}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return ax
