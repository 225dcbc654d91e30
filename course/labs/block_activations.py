"""What one transformer block keeps for backward under tensor and sequence parallelism (chapter 26): the bytes
measured on real ranks, and the picture of them beside Korthikanti's formula."""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist

import sim
from zero_ref.measure import saved_activation_bytes
from zero_ref.memory import activation_bytes_per_layer
from zero_ref.models import GPTConfig
from zero_ref.models.gpt import Block
from zero_ref.parallel.tensor import ParallelBlock

STYLES = {(False, "none"): ("#4C72B0", "TP"), (True, "none"): ("#55A868", "TP + SP"),
          (True, "selective"): ("#C44E52", "TP + SP + selective"), (True, "full"): ("#8172B2", "TP + SP + full")}


def measure_block(rank, world, seqs, modes, hidden, heads, batch):
    """Bytes autograd saves on this rank for one bf16 GPT block split over all ranks, {(s, sp, recompute): bytes}
    for every s in ``seqs`` and (sequence_parallel, recompute) in ``modes``."""
    out = {}
    for s in seqs:
        torch.manual_seed(0)
        block = Block(GPTConfig(vocab_size=64, seq_len=s, d_model=hidden, n_heads=heads, dropout=0.1))
        for sp, rc in modes:
            pb = ParallelBlock(block, dist.group.WORLD, sequence_parallel=sp, recompute=rc).to(torch.bfloat16).train()
            x = torch.randn(s // world if sp else s, batch, hidden, dtype=torch.bfloat16, requires_grad=True)
            with saved_activation_bytes(pb) as acts:
                y = pb(x)
            y.float().sum().backward()          # what was saved is what backward needs
            out[(s, sp, rc)] = acts.total
    return out


def bytes_per_layer_figure(measured, seqs, batch, hidden, heads, tp=2):
    """Left: the formula's bytes per layer per rank over s for the tiny block, and as points ``measured`` (what
    ``measure_block`` returns) less the LayerNorm statistics; right: GPT-3 175B at t = 8, b = 1, 80 GB for scale."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    xs = list(range(16, 513, 8))
    ax1.plot(xs, [activation_bytes_per_layer(s, batch, hidden, heads) / 1e3 for s in xs], color="gray", ls=":",
             label="one GPU")
    for (sp, rc), (color, label) in STYLES.items():
        formula = [activation_bytes_per_layer(s, batch, hidden, heads, tp=tp, sp=sp, recompute=rc) for s in xs]
        ax1.plot(xs, [v / 1e3 for v in formula], color=color, label=label)
        ln_stats = [0 if rc == "full" else 8 * s * batch // (tp if sp else 1) for s in seqs]
        ax1.scatter(seqs, [(measured[(s, sp, rc)] - ln) / 1e3 for s, ln in zip(seqs, ln_stats)], color=color, zorder=3,
                    s=25)
    s_star = 34 * hidden / (5 * heads)
    ax1.axvline(s_star, color="k", lw=0.8, ls="--")
    ax1.text(s_star * 1.03, 5, "s*", fontsize=9)
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("sequence length s")
    ax1.set_ylabel("kB per layer per rank")
    ax1.set_title(f"h = {hidden}, a = {heads}, b = {batch}, t = {tp} (points measured)", fontsize=9)
    ax1.legend(fontsize=7)
    big = sim.Model.preset("gpt3-175b")
    xs2 = [2**k for k in range(10, 18)]
    for (sp, rc), (color, label) in STYLES.items():
        ax2.plot(xs2, [activation_bytes_per_layer(s, 1, big.hidden, big.heads, tp=8, sp=sp, recompute=rc) / 1e9
                       for s in xs2], color=color, marker="o", ms=3, label=label)
    ax2.axhline(80, color="k", lw=0.8)
    ax2.text(1100, 90, "80 GB", fontsize=8)
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("sequence length s")
    ax2.set_ylabel("GB per layer per GPU")
    ax2.set_title("GPT-3 175B, b = 1, t = 8", fontsize=9)
    plt.tight_layout()
    return fig
