"""``interactive``: ipywidgets' ``interactive`` whose updates draw one at a time.

JupyterLab 4.6 sends widget messages to kernel subshells and ipykernel 7 runs each subshell on its own
thread, so two slider moves can run a chapter's drawing function at the same moment; pyplot's state is
global, and the two figures come out drawn into each other, blank or half drawn. Each update here
holds ``sim.widgets.DRAW_LOCK`` (the lock the simulator's explorers take) for the whole update:
clearing the output, calling the function, showing its figures. ``make setup`` also turns the
subshells off for comm messages in the project's JupyterLab (scripts/jupyter_lab_overrides.json);
the lock is what holds in every front end.

    from course.widgets import interactive
    interactive(draw, p=widgets.IntSlider(value=4, min=1, max=8))
"""
import ipywidgets

from sim.widgets import DRAW_LOCK


class interactive(ipywidgets.interactive):  # noqa: N801 - the name ipywidgets gives it
    def update(self, *args):
        with DRAW_LOCK:
            return super().update(*args)
