"""A dynamic loss scaler's run drawn over time: the scale each step used, the skipped steps, the hysteresis."""
from __future__ import annotations

import math


def plot_loss_scale(log, ceiling: int, title: str):
    """Draw ``log``, rows ``(iteration, scale used, overflowed, hysteresis after the step)``, in two panels:
    log2 of the scale with the overflowing steps marked and a dotted line at 2**``ceiling`` (the largest scale
    that does not overflow), and the hysteresis below. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    its = [it for it, *_ in log]
    ax1.step(its, [math.log2(s) for _, s, _, _ in log], where="post", color="#4C72B0", label="scale used at the step")
    skipped = [(it, math.log2(s)) for it, s, o, _ in log if o]
    if skipped:
        ax1.scatter(*zip(*skipped), color="#C44E52", zorder=3, label="overflow: step skipped")
    ax1.axhline(ceiling, color="gray", ls=":", lw=1)
    ax1.text(its[-1], ceiling + 0.1, f"largest scale without overflow (2^{ceiling})", ha="right", va="bottom",
             fontsize=8, color="gray")
    ax1.set_ylabel("log2(loss scale)")
    ax1.legend(loc="upper right", fontsize=8)
    ax1.set_title(title)
    ax2.step(its, [h for *_, h in log], where="post", color="#55A868")
    ax2.set_ylabel("hysteresis\nafter the step")
    ax2.set_yticks(sorted({h for *_, h in log} | {1, 2}))
    ax2.set_xlabel("iteration")
    fig.tight_layout()
    return fig
