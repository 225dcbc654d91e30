"""sim.views.render: the Gantt chart, the memory stack and the bubble bars draw what the result holds."""
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

import sim  # noqa: E402
from sim.step.graph import STREAMS  # noqa: E402
from sim.views import render  # noqa: E402

MODEL = sim.Model("tiny", layers=8, hidden=256, heads=8, vocab=1000, seq=128)


def simulate(**kw):
    plan = sim.Plan(**{"tp": 2, "pp": 2, "dp": 2, "zero_stage": 2, "num_microbatches": 4, **kw})
    cluster = sim.Cluster.preset("A100-80GB", nodes=1, gpus_per_node=plan.world_size)
    return sim.simulate(MODEL, cluster, plan, sim.Costs(), granularity="layer")


@pytest.fixture(autouse=True)
def no_show(monkeypatch):
    monkeypatch.setattr(plt, "show", lambda *a, **k: pytest.fail("a renderer called plt.show()"))
    yield
    plt.close("all")


def test_import_render_does_not_import_matplotlib():
    code = "import sys, sim, sim.views.render; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("schedule,virtual", [("1f1b", 1), ("interleaved", 2)])
def test_gantt_has_one_collection_per_stream_and_bars_span_the_events(schedule, virtual):
    r = simulate(schedule=schedule, virtual=virtual)
    ax = render.gantt(r, labels=True)
    colls = [c for c in ax.collections if isinstance(c, PolyCollection)]
    g = r.graph
    used = [k for k in range(len(STREAMS)) if k in set(g.stream)]
    assert [c.get_label() for c in colls] == [STREAMS[k] for k in used]
    assert len(ax.get_yticklabels()) == r.plan.pp * len(used)
    for c, k in zip(colls, used):
        idx = [i for i in range(len(g)) if g.stream[i] == k]
        paths = c.get_paths()
        assert len(paths) == len(idx)  # one bar per event
        for p, i in zip(paths, idx):
            xs = p.vertices[:, 0]
            assert xs.min() == r.start[i] and xs.max() == r.end[i]
    # micro-batch labels: one per forward/backward op (per chunk when interleaved)
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == 2 * r.plan.pp * r.plan.num_microbatches * virtual
    assert sum(t.startswith("F") for t in texts) == len(texts) // 2
    if virtual > 1:
        assert any(t.endswith(".c1") for t in texts)
    # forward and backward bars carry their own colours on the compute row
    compute = colls[used.index(STREAMS.index("compute"))]
    faces = {tuple(f) for f in compute.get_facecolors()}
    assert {to_rgba(render.KIND_COLORS["forward"]), to_rgba(render.KIND_COLORS["backward"])} <= faces


def test_gantt_selected_stages_and_streams_and_events_match():
    r = simulate()
    fig, ax = plt.subplots()
    assert render.gantt(r, ax=ax, stages=[1], streams=["compute", "pp_comm"], labels=True) is ax
    colls = [c for c in ax.collections if isinstance(c, PolyCollection)]
    on1 = [e for e in r.events if e.stage == 1]
    assert [len(c.get_paths()) for c in colls] == [sum(e.stream == s for e in on1) for s in ("compute", "pp_comm")]
    starts = sorted(p.vertices[:, 0].min() for c in colls for p in c.get_paths())
    assert starts == sorted(e.start for e in on1 if e.stream in ("compute", "pp_comm"))
    assert len(ax.texts) == 2 * r.plan.num_microbatches
    assert not render.gantt(r, labels=False).texts
    auto = render.gantt(r).texts  # 'auto': only spans wide enough to hold a label
    assert 0 < len(auto) <= 4 * r.plan.num_microbatches
    with pytest.raises(ValueError, match="stage 5"):
        render.gantt(r, stages=[5])


def test_memory_stack_stacks_categories_in_torch_colours_up_to_the_peak():
    r = simulate(zero_stage=3)
    ax = render.memory_stack(r, stage=0)
    polys = [c for c in ax.collections if isinstance(c, PolyCollection)]
    _, curves = r.memory.curve(0)
    cats = [c for c in render.MEMORY_ORDER if curves[c].any()]
    assert {"param", "optim", "grad", "activation", "zero3_gathered"} <= set(cats)
    assert len(polys) == len(cats)
    for poly, c in zip(polys, cats):
        assert poly.get_facecolor()[0][:3] == pytest.approx(to_rgba(render.MEMORY_COLORS[c])[:3])
    top = max(p.get_paths()[0].vertices[:, 1].max() for p in polys)
    assert top == pytest.approx(r.memory.peak(0)["total"] / 2**30)
    assert any(line.get_ydata()[0] == pytest.approx(top) for line in ax.get_lines())  # the peak line
    assert render.MEMORY_COLORS["param"] == "darkgreen" and render.MEMORY_COLORS["activation"] == "red"


def test_bubble_bars_are_the_closed_forms():
    ax = render.bubble_bars(stages=(4, 8), microbatches=(1, 4, 8, 16), virtual=(1, 2))
    bars = ax.patches
    # v = 1: every m; v = 2: only m that are multiples of p (4: 4, 8, 16; 8: 8, 16)
    assert len(bars) == 4 + 3 + 4 + 2
    heights = sorted(round(b.get_height(), 12) for b in bars)
    want = sorted(round(sim.bubble_fraction(p, m, v), 12) for p in (4, 8) for v in (1, 2)
                  for m in (1, 4, 8, 16) if v == 1 or m % p == 0)
    assert heights == want
    r = simulate(num_microbatches=8)
    ax = render.bubble_bars(stages=(2,), microbatches=(8,), virtual=(1,), kind="overhead", results=[r])
    assert ax.patches[0].get_height() == pytest.approx(1 / 8)
    marker = ax.get_lines()[0].get_ydata()[0]
    assert marker == pytest.approx(r.bubble_fraction / (1 - r.bubble_fraction))


def test_drawing_again_on_the_same_axes_replaces_the_picture():
    a, b = simulate(num_microbatches=4), simulate(num_microbatches=8)
    fig, (g, m) = plt.subplots(2, 1)
    g.axhline(0.5, label="mine")  # an artist the caller drew stays
    render.gantt(a, ax=g, labels=True)
    render.memory_stack(a, ax=m)
    counts = len(g.collections), len(g.texts), len(m.collections), len(m.lines)
    render.gantt(b, ax=g, labels=True)
    render.memory_stack(b, ax=m, legend="short")
    assert (len(g.collections), len(g.texts) // 2, len(m.collections), len(m.lines)) == (
        counts[0], counts[1], counts[2], counts[3])  # twice the micro-batches: twice the labels
    assert any(line.get_label() == "mine" for line in g.get_lines())
    paths = sum(len(c.get_paths()) for c in g.collections if isinstance(c, PolyCollection))
    assert paths == len(b.graph)
    assert g.get_xlim()[1] == pytest.approx(b.step_time * 1.01)
    assert [t.get_text() for t in m.get_legend().get_texts()][0] == "param"  # short labels
    assert m.get_ylim()[1] == pytest.approx(b.memory.peak(0)["total"] / 2**30 * 1.05)
    assert render.memory_stack(b, ax=m, legend=None).get_legend() is None


def test_idle_bars_stack_each_stage_idle_share_by_cause():
    r = simulate(num_microbatches=4)
    ax = render.idle_bars(r)
    heights = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        heights[x] = max(heights.get(x, 0.0), bar.get_y() + bar.get_height())
    idle = 1 - r.busy["compute"] / r.step_time
    assert [heights[s] for s in range(r.plan.pp)] == pytest.approx(list(idle), rel=1e-9)
    assert np.mean(list(heights.values())) == pytest.approx(r.bubble_fraction, rel=1e-9)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "fill/drain" in labels and any(t.startswith("(p−1)/(vm+p−1)") for t in labels)
    assert ax.get_lines()[0].get_ydata()[0] == pytest.approx(sim.bubble_fraction(2, 4))
