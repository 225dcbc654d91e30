"""course.labs.loss_scale_plot draws the scaler's run it is given: the scale used, the skipped steps, the hysteresis."""
import math

import matplotlib

matplotlib.use("Agg")

from course.labs.loss_scale_plot import plot_loss_scale  # noqa: E402
from zero_ref.precision import DynamicLossScaler  # noqa: E402


def test_the_plot_holds_the_run():
    scaler, log = DynamicLossScaler(init_scale=2**4, scale_window=2, delayed_shift=2), []
    for it in range(12):
        scale = scaler.cur_scale
        overflow = scale > 2**3 or it == 7
        scaler.update_scale(overflow)
        log.append((it, scale, overflow, scaler.cur_hysteresis))
    fig = plot_loss_scale(log, ceiling=3, title="run")
    top, bottom = fig.axes
    assert list(top.lines[0].get_ydata()) == [math.log2(s) for _, s, _, _ in log]
    marked = [tuple(xy) for xy in top.collections[0].get_offsets()]
    assert marked == [(it, math.log2(s)) for it, s, o, _ in log if o] and len(marked) >= 2
    assert top.lines[1].get_ydata()[0] == 3 and top.get_title() == "run"
    assert list(bottom.lines[0].get_ydata()) == [h for *_, h in log]
