"""``interactive``: ipywidgets' ``interactive`` whose updates draw one at a time; ``log_slider``: a log
slider that starts where its figure is drawn.

JupyterLab 4.6 sends widget messages to kernel subshells and ipykernel 7 runs each subshell on its own
thread, so two slider moves can run a chapter's drawing function at the same moment; pyplot's state is
global, and the two figures come out drawn into each other, blank or half drawn. Each update here
holds ``sim.views.widgets.DRAW_LOCK`` (the lock the simulator's explorers take) for the whole update:
clearing the output, calling the function, showing its figures. ``make setup`` also turns the
subshells off for comm messages in the project's JupyterLab (scripts/jupyter_lab_overrides.json);
the lock is what holds in every front end.

    from course.widgets import interactive, log_slider
    interactive(draw, p=widgets.IntSlider(value=4, min=1, max=8), psi=log_slider(7.5, 0.1, 1000, "Ψ (B)"))
"""
import math

import ipywidgets

from sim.views.widgets import DRAW_LOCK


class interactive(ipywidgets.interactive):  # noqa: N801 - the name ipywidgets gives it
    def update(self, *args):
        with DRAW_LOCK:
            return super().update(*args)


def log_slider(value: float, lo: float, hi: float, description: str, step: float = 0.05, **kwargs):
    """A base-10 ``FloatLogSlider`` from about ``lo`` to ``hi`` whose grid (``step`` in log10) passes through
    ``value``. The browser snaps the value onto the grid when it shows the slider, so a default off the grid
    (7.5 on a grid from 10^-1 in 0.05 steps shows as 7.94) would be drawn at one value and read out at another
    until the first move."""
    e = math.log10(value)
    below, above = round((e - math.log10(lo)) / step), round((math.log10(hi) - e) / step)
    return ipywidgets.FloatLogSlider(value=value, base=10, min=e - below * step, max=e + above * step, step=step,
                                     description=description, **kwargs)
