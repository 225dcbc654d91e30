"""The ZeRO ladder of chapter 8: stages 0-3 measured on real ranks, and the rungs of the simulator drawn.

``ladder_run`` is a rank function for ``zero_ref.launch`` (cloudpickle sends it by name, so the child
imports this module).
"""
import matplotlib.pyplot as plt
import torch
import torch.nn as nn

from zero_ref import comm
from zero_ref.measure import unique_storage_bytes
from zero_ref.memory import GiB
from zero_ref.optim import AdamConfig
from zero_ref.stages import STAGES


def ladder_run(rank, world_size, widths, stages=(0, 1, 2, 3)):
    """One bf16 step of each ZeRO stage on an MLP of ``widths``: {stage: (bytes held by category, comm records)}."""
    out = {}
    for stage in stages:
        torch.manual_seed(0)
        layers = [m for a, b in zip(widths, widths[1:]) for m in (nn.Linear(a, b), nn.GELU())][:-1]
        net = nn.Sequential(*layers)
        extra = {"param_persistence_threshold": 0} if stage == 3 else {}   # no unit stays gathered
        opt = STAGES[stage](net, adam=AdamConfig(lr=1e-3), precision="bf16", **extra)
        g = torch.Generator().manual_seed(rank)                             # each rank its own batch
        x = torch.randn(8, widths[0], generator=g).bfloat16().requires_grad_()
        with comm.recording() as log:
            opt.backward(net(x).float().pow(2).mean())
            opt.step()
        held = {k: unique_storage_bytes(v) for k, v in opt.state_tensors().items()}
        out[stage] = held, [(r.op, r.dtype, r.wire_bytes) for r in log.records]
    return out


def sent_bytes(records):
    """(bf16 data bytes, control bytes) one rank sent: control = the gradient-norm all-reduce, ZeRO-3's headers."""
    data = sum(w for _, dtype, w in records if dtype == "bfloat16")
    return data, sum(w for _, _, w in records) - data


def ladder_chart(steps, hbm_bytes, first_fit=None):
    """Bars of each rung's GPU GiB per rank (log scale) against the usable 90 % of ``hbm_bytes``; returns the axes.

    ``steps`` are ``sim.planning.advice.ladder``'s; green fits, orange fits the GPU only, red does not.
    """
    fig, ax = plt.subplots(figsize=(9, 3.4))
    limit = 0.9 * hbm_bytes / GiB
    colors = ["tab:green" if s.fits else ("tab:orange" if s.fits_gpu else "tab:red") for s in steps]
    ax.bar(range(len(steps)), [s.gpu_bytes / GiB for s in steps], color=colors)
    ax.axhline(limit, color="black", ls="--", lw=1)
    ax.text(len(steps) - 0.5, limit * 1.1, f"usable {limit:.0f} GiB", ha="right", fontsize=8)
    if first_fit:
        i = steps.index(first_fit)
        ax.annotate("first fit", (i, first_fit.gpu_bytes / GiB), xytext=(0, 12), textcoords="offset points",
                    ha="center", fontsize=8, arrowprops=dict(arrowstyle="->"))
    ax.set_xticks(range(len(steps)), [s.rung.name.replace(" (", "\n(") for s in steps], rotation=30, ha="right",
                  fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("GPU GiB per rank")
    ax.set_title("green: fits; orange: fits the GPU but not the host/NVMe; red: too big for the GPU", fontsize=9)
    plt.tight_layout()
    return ax
