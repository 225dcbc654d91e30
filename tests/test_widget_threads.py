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
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course.widgets import interactive  # noqa: E402

WAIT_S = 2.0  # how long an update waits for a second one to join it inside the drawing function


def concurrent_updates(make, threads: int = 2) -> tuple[list[str], list[int]]:
    """Move a slider from ``threads`` threads at once; per update: met another inside? figures open."""
    barrier = threading.Barrier(2, timeout=WAIT_S)
    met, open_figures = [], []

    def draw(x):
        if x == 0:
            return  # the call at construction
        fig, ax = plt.subplots(figsize=(2, 1))
        ax.plot([0, 1], [x, x])
        try:
            barrier.wait()
            met.append("together")
        except threading.BrokenBarrierError:
            met.append("alone")
            barrier.reset()
        open_figures.append(len(plt.get_fignums()))
        fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)

    sliders = [ipywidgets.IntSlider(value=0, min=0, max=10) for _ in range(threads)]
    make(draw, **{f"x{k}": s for k, s in enumerate(sliders)})
    workers = [threading.Thread(target=setattr, args=(s, "value", k + 1)) for k, s in enumerate(sliders)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=30)
    return met, open_figures


def test_course_interactive_draws_one_update_at_a_time():
    made = []

    def make(draw, **sliders):
        for s in sliders.values():
            made.append(interactive(draw, x=s))

    met, open_figures = concurrent_updates(make)
    assert met == ["alone", "alone"] and open_figures == [1, 1]  # never two figures at once


def test_ipywidgets_interactive_lets_two_updates_draw_together():
    """The control: without the lock the two updates are inside the drawing function at once."""
    made = []

    def make(draw, **sliders):
        for s in sliders.values():
            made.append(ipywidgets.interactive(draw, x=s))

    met, _ = concurrent_updates(make)
    assert met == ["together", "together"]


def test_sim_explorers_hold_the_same_lock(monkeypatch):
    from sim import widgets
    explorers = [widgets.pipeline_explorer() for _ in range(2)]
    barrier = threading.Barrier(2, timeout=WAIT_S)
    met = []
    for e in explorers:
        original = e.compute

        def compute(*a, _original=original, **kw):
            try:
                barrier.wait()
                met.append("together")
            except threading.BrokenBarrierError:
                met.append("alone")
                barrier.reset()
            return _original(*a, **kw)
        monkeypatch.setattr(e, "compute", compute)
    workers = [threading.Thread(target=e.update) for e in explorers]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=30)
    assert met == ["alone", "alone"]
    assert widgets.DRAW_LOCK is __import__("course.widgets", fromlist=["DRAW_LOCK"]).DRAW_LOCK


def test_the_projects_jupyterlab_sends_no_comms_to_subshells():
    """make setup writes this into the environment's JupyterLab settings; the key must be one that the
    installed JupyterLab knows, with a value its schema allows."""
    import sys
    overrides = json.loads((Path(__file__).resolve().parents[1] / "scripts" / "jupyter_lab_overrides.json").read_text())
    plugin = "@jupyterlab/apputils-extension:kernels-settings"
    assert overrides[plugin]["commsOverSubshells"] == "disabled"
    schema = Path(sys.prefix) / "share/jupyter/lab/schemas/@jupyterlab/apputils-extension/kernels-settings.json"
    allowed = [c["const"] for c in json.loads(schema.read_text())["properties"]["commsOverSubshells"]["oneOf"]]
    assert "disabled" in allowed
    installed = Path(sys.prefix) / "share/jupyter/lab/settings/overrides.json"
    if not installed.exists():
        pytest.skip("this environment was not set up by make setup")
    assert json.loads(installed.read_text())[plugin]["commsOverSubshells"] == "disabled"
