"""Chapter 27's pictures, one panel each: the bytes every rank wrote into a checkpoint, the losses of a resumed
run beside the uninterrupted one, and an elastic run's step counter through a kill and a restart."""
from __future__ import annotations

import os
import re

from zero_ref.checkpoint import Reader

FILE_KINDS = [("optimizer shard", "optim_states_rank00{r}.pt", "#4C72B0"),
              ("parameter shard", "param_states_rank00{r}.pt", "#55A868"),
              ("model states (rank 0)", "model_states.pt", "#8172B2")]


def bytes_per_rank(ax, root, psi: int, stages=(0, 1, 2, 3), world: int = 2) -> None:
    """Stacked bars of the payload each rank wrote into ``root/stage{s}/global_step3`` by file kind, with the
    12·⌈Ψ/N⌉ bytes of optimizer state per rank as a line."""
    for stage in stages:
        reader = Reader(os.path.join(root, f"stage{stage}", "global_step3"))
        for r in range(world):
            bottom = 0
            for label, pattern, color in FILE_KINDS:
                f = pattern.format(r=r)
                written = f in reader.meta["file_bytes"] and (r == 0 or "{r}" in pattern)  # model states: rank 0's
                kib = reader.state_bytes(f) / 1024 if written else 0
                ax.bar(stage * 3 + r, kib, bottom=bottom, color=color, label=label if stage == r == 0 else None)
                bottom += kib
    ax.set_xticks([s * 3 + 0.5 for s in stages], [f"stage {s}\nrank 0 | 1" for s in stages])
    ax.axhline(12 * -(-psi // world) / 1024, color="k", lw=0.8, ls=":", label="12·⌈Ψ/N⌉")
    ax.set_ylabel("KiB written")
    ax.legend(fontsize=7)
    ax.set_title(f"bytes per rank, N = {world}")


def resume_losses(ax, la, lb, lc, title: str) -> None:
    """Run A's losses over steps 1-6, B's (resumed after step 3) and C's (weights only) over steps 4-6."""
    ax.plot(range(1, 7), la, "o-", color="#4C72B0", label="A: uninterrupted")
    ax.plot(range(4, 7), lb, "x", ms=10, color="#DD8452", label="B: resumed from step 3")
    ax.plot([3, 4, 5, 6], [la[2]] + lc, "s--", color="#C44E52", label="C: weights only")
    ax.axvline(3, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (global batch)")
    ax.legend(fontsize=8)
    ax.set_title(title)


def elastic_progress(ax, said: list[str], kill_at: int) -> None:
    """The global step of each line the elastic lab printed ("attempt N: ... step S ..."), the kill and the
    resume marked; the killed rank's line counts at step ``kill_at`` (it dies while saving it)."""
    progress = []
    for x in said:
        m = re.search(r"step (\d+)", x)
        if m or "is killed" in x:
            progress.append((int(x.split()[1].rstrip(":")), int(m.group(1)) if m else kill_at, x))
    ax.plot(range(len(progress)), [p[1] for p in progress], "o-", color="#4C72B0")
    for i, (attempt, step, text) in enumerate(progress):
        if "resumed" in text or "is killed" in text:
            ax.annotate("resumed" if "resumed" in text else "killed", (i, step), textcoords="offset points",
                        xytext=(5, -12))
    ax.set_xlabel("event (printed lines)")
    ax.set_ylabel("global step")
    ax.set_title(f"elastic run: rank 1 killed saving step {kill_at}")
