"""Widget updates that arrive on several threads at once (JupyterLab's comms over kernel subshells,
ipykernel 7) draw one after the other: course.widgets.interactive and sim's explorers hold one lock
for the whole update, so no figure is drawn into another.

Deterministic, not a race left to chance: the drawing function waits at a two-party barrier. Two
updates that can be inside it together meet there (ipywidgets' own ``interactive``, the control);
updates that run one at a time never do, and every wait times out alone.
"""
import io
import json
import threading
from pathlib import Path

import ipywidgets
import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course.widgets import interactive  # noqa: E402

WAIT_S = 2.0  # how long an update waits for a second one to join it inside the drawing function


def meet(barrier: threading.Barrier, met: list) -> None:
    """Wait for a second update inside the drawing code: "together" if one came, "alone" if none could."""
    try:
        barrier.wait()
        met.append("together")
    except threading.BrokenBarrierError:
        met.append("alone")
        barrier.reset()


def run_at_once(targets) -> None:
    workers = [threading.Thread(target=t) for t in targets]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=30)


def concurrent_updates(kind, threads: int = 2) -> tuple[list[str], list[int]]:
    """Two ``kind`` (an interactive class) on two sliders, moved from two threads at once; per update:
    did it meet the other inside the drawing function, and how many figures were open there."""
    barrier = threading.Barrier(2, timeout=WAIT_S)
    met, open_figures = [], []

    def draw(x):
        if x == 0:
            return  # the call at construction
        fig, ax = plt.subplots(figsize=(2, 1))
        ax.plot([0, 1], [x, x])
        meet(barrier, met)
        open_figures.append(len(plt.get_fignums()))
        fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)

    sliders = [ipywidgets.IntSlider(value=0, min=0, max=10) for _ in range(threads)]
    made = [kind(draw, x=s) for s in sliders]  # noqa: F841 - kept alive while the sliders move
    run_at_once([lambda s=s, k=k: setattr(s, "value", k + 1) for k, s in enumerate(sliders)])
    return met, open_figures


def test_course_interactive_draws_one_update_at_a_time():
    met, open_figures = concurrent_updates(interactive)
    assert met == ["alone", "alone"] and open_figures == [1, 1]  # never two figures at once


def test_ipywidgets_interactive_lets_two_updates_draw_together():
    """The control: without the lock the two updates are inside the drawing function at once."""
    met, _ = concurrent_updates(ipywidgets.interactive)
    assert met == ["together", "together"]


def test_sim_explorers_hold_the_same_lock(monkeypatch):
    from sim.views import widgets
    explorers = [widgets.pipeline_explorer() for _ in range(2)]
    barrier = threading.Barrier(2, timeout=WAIT_S)
    met = []
    for e in explorers:
        def compute(*a, _original=e.compute, **kw):
            meet(barrier, met)
            return _original(*a, **kw)
        monkeypatch.setattr(e, "compute", compute)
    run_at_once([e.update for e in explorers])
    assert met == ["alone", "alone"]
    assert widgets.DRAW_LOCK is __import__("course.widgets", fromlist=["DRAW_LOCK"]).DRAW_LOCK


def test_the_projects_jupyterlab_sends_no_comms_to_subshells():
    """make setup writes this into the environment's JupyterLab settings; the key must be one that the
    installed JupyterLab knows, with a value its schema allows."""
    import sys
    overrides = json.loads((Path(__file__).resolve().parents[2] / "scripts" / "jupyter_lab_overrides.json").read_text())
    plugin = "@jupyterlab/apputils-extension:kernels-settings"
    assert overrides[plugin]["commsOverSubshells"] == "disabled"
    schema = Path(sys.prefix) / "share/jupyter/lab/schemas/@jupyterlab/apputils-extension/kernels-settings.json"
    allowed = [c["const"] for c in json.loads(schema.read_text())["properties"]["commsOverSubshells"]["oneOf"]]
    assert "disabled" in allowed
    installed = Path(sys.prefix) / "share/jupyter/lab/settings/overrides.json"
    if not installed.exists():
        pytest.skip("this environment was not set up by make setup")
    assert json.loads(installed.read_text())[plugin]["commsOverSubshells"] == "disabled"


@pytest.mark.parametrize("value,lo,hi,step", [(7.5, 0.1, 1000, 0.05), (7, 0.1, 1000, 0.1), (6.0, 0.1, 1000, 0.1),
                                              (160.0, 0.1, 1000, 0.1), (65, 0.1, 1000, 0.1), (0.3, 0.01, 5, 0.25)])
def test_a_log_slider_starts_on_its_grid(value, lo, hi, step):
    """The browser snaps a FloatLogSlider's value onto min + k·step (in log10): log_slider's grid holds the
    default, so the figure drawn first and the readout agree; the range covers lo to hi within half a step."""
    import math

    from course.widgets import log_slider
    s = log_slider(value, lo, hi, "x", step=step)
    k = (math.log10(value) - s.min) / step
    assert s.value == value and abs(k - round(k)) < 1e-9
    assert abs(s.min - math.log10(lo)) <= step / 2 + 1e-12 and abs(s.max - math.log10(hi)) <= step / 2 + 1e-12


def test_the_chapters_log_sliders_are_log_slider():
    """A bare FloatLogSlider in a chapter would start off its grid (see above)."""
    bare = [p.name for p in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("ch*.ipynb"))
            if any("FloatLogSlider(" in c["source"] for c in nbformat.read(p, as_version=4).cells)]
    assert not bare, f"use course.widgets.log_slider in {bare}"
