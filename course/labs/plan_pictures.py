"""Pictures of simulated plans: the first pipeline stage's memory by category beside where the step time goes
(chapter 24), and a search's simulated plans on the memory–time plane with their Pareto front (chapter 29).
They draw with matplotlib and leave ``plt.show()`` to the caller."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from zero_ref.memory import GiB

# torch.profiler's memory-timeline colours, as sim.views.render uses them
CATEGORIES = [("param", "params", "darkgreen"), ("grad", "grads", "mediumblue"), ("optim", "optimizer", "goldenrod"),
              ("activation", "activations", "red")]
ZERO_COLORS = {0: "tab:blue", 1: "tab:green", 2: "tab:orange", 3: "tab:red"}


def memory_and_time(memory: dict, timed: dict, title: str):
    """Left: stage 0's peak bytes by category for each simulated result in ``memory`` (log scale, an 80 GiB line);
    right: the step of each result in ``timed`` split into compute, TP collectives and the rest. Keys label the bars."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    bottom = np.zeros(len(memory))
    for key, label, color in CATEGORIES:
        vals = np.array([r.peak_memory[0][key] / GiB for r in memory.values()])
        ax.bar(list(memory), vals, bottom=bottom, color=color, label=label)
        bottom += vals
    ax.axhline(80, color="black", ls="--", lw=1)
    ax.text(len(memory) - 0.6, 85, "80 GiB", ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(bottom=1)
    ax.set_ylabel("stage-0 peak memory (GiB, log scale)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    for i, r in enumerate(timed.values()):
        compute = float(r.busy["compute"].mean())
        tp = float(r.busy["tp_comm"].mean())
        ax2.barh(i, compute, color="tab:blue", label="compute" if i == 0 else None)
        ax2.barh(i, tp, left=compute, color="tab:orange", label="TP collectives" if i == 0 else None)
        ax2.barh(i, r.step_time - compute - tp, left=compute + tp, color="0.7",
                 label="bubble, other idle" if i == 0 else None)
    ax2.set_yticks(range(len(timed)), list(timed))
    ax2.set_xlabel("seconds per step (stage average)")
    ax2.set_title("Where the step time goes")
    ax2.legend(fontsize=8, loc="lower right")
    plt.tight_layout()
    return fig


def draw_front(ax, found, best: bool = False) -> None:
    """On ``ax``: every plan ``found`` (a ``sim.planning.search`` result) simulated, coloured by ZeRO stage, its
    Pareto front as a step line and, with ``best``, the best plan as a star; axes in GiB per rank and seconds.
    ``found`` None (no plan fits): the labelled axes only."""
    ax.set_xlabel("peak GPU memory per rank (GiB)")
    ax.set_ylabel("step time (s)")
    if found is None:
        return
    for z in sorted({r.plan.zero_stage for r in found.feasible}):  # a stage nothing was simulated for: no legend entry
        sims = [r for r in found.feasible if r.plan.zero_stage == z]
        ax.scatter([r.peak_bytes / GiB for r in sims], [r.step_time for r in sims], s=14, color=ZERO_COLORS[z],
                   label=f"simulated, ZeRO-{z}")
    front = found.pareto_front()
    ax.step([r.peak_bytes / GiB for r in front], [r.step_time for r in front], where="post", color="black", lw=1.2,
            label="Pareto front")
    if best:
        ax.scatter([found.best.peak_bytes / GiB], [found.best.step_time], s=120, marker="*", color="black", zorder=3,
                   label="the best plan")
