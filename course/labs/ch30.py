"""Chapter 30's trial: a plan's tp × pp × dp layout, scaled down, trained on CPU ranks and set beside the simulator.

``scaled_layout(plan)`` keeps every axis the plan splits (each at 2 ranks, at most 8 in all) and the ZeRO
stage where ``ThreeD`` runs it; ``trial`` is the rank function (``zero_ref.launch(trial, world, ...)``) and
``simulated`` is the simulator's booking of the same layout on the same small GPT.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course.labs import three_d as lab
from zero_ref import comm
from zero_ref.measure import unique_storage_bytes
from zero_ref.parallel.groups import build_groups
from zero_ref.parallel.topology import Topology
from zero_ref.recipes.three_d import ThreeD

CFG = lab.CFG  # chapter 22's GPT
GLOBAL_BATCH, MICROBATCHES = 16, 4  # sequences per step, and per data-parallel rank the pipeline's micro-batches
AXES = ("tp", "pp", "dp")


@dataclass(frozen=True)
class Layout:
    """The trial's grid and the ZeRO stage it runs over dp; ``note`` says what was scaled and why."""
    tp: int
    pp: int
    dp: int
    zero_stage: int
    note: str

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


def scaled_layout(plan) -> Layout:
    """Each axis the plan splits at 2 ranks (one it does not split at 1); ZeRO-0/1 as planned, ZeRO-2/3 as ZeRO-1.

    ``ThreeD`` runs tensor and pipeline parallelism with ZeRO-0 or ZeRO-1 over dp only (it refuses 2 and 3,
    as DeepSpeed's PipelineEngine does with a pipeline); a ZeRO-2/3 plan's own dp traffic and memory are the
    engine's, checked in step 3 and in chapters 4 and 5."""
    tp, pp, dp = (2 if n > 1 else 1 for n in (plan.tp, plan.pp, plan.dp))
    stage = min(plan.zero_stage, 1)
    note = f"tp {plan.tp} → {tp}, pp {plan.pp} → {pp}, dp {plan.dp} → {dp}; ZeRO-{stage}"
    if plan.zero_stage > 1:
        note += (f" in place of the plan's ZeRO-{plan.zero_stage}: ThreeD runs ZeRO-0/1 over dp with tensor and "
                 f"pipeline parallelism; ZeRO-{plan.zero_stage}'s own bytes are the engine's (step 3, chapters 4–5)")
    return Layout(tp, pp, dp, stage, note)


def trial(rank: int, world: int, tp: int, pp: int, zero_stage: int) -> dict:
    """One step of the course GPT on this grid; every call's ring bytes go to the axis whose group carried it."""
    topo = Topology.for_world(world, tp=tp, pp=pp)
    trainer = ThreeD(lab.build_model(), build_groups(topo), microbatches=MICROBATCHES, zero_stage=zero_stage,
                     adam=lab.ADAM)
    axes = {axis: set(g) for axis in AXES for g in topo.groups(axis) if rank in g}
    sent = dict.fromkeys(AXES, 0.0)

    def count(op, tensor, group):
        if tensor is None or (group is None and op != "send"):  # the barrier; the loss over all ranks
            return
        n = 2 if op == "send" else dist.get_world_size(group)
        members = set(dist.get_process_group_ranks(group)) if group is not None else None
        axis = "pp" if op == "send" else next(a for a, m in axes.items() if m == members)
        sent[axis] += comm.ring_wire_bytes(op, tensor.numel() * tensor.element_size(), n)

    start = time.perf_counter()
    with comm.hooked(count):
        trainer.train_step(*lab.batch(lab.corpus(), 0, GLOBAL_BATCH))
    return dict(coords=tuple(trainer.groups.coords), sends=sent, seconds=time.perf_counter() - start,
                memory={k: unique_storage_bytes(v) for k, v in trainer.optimizer.state_tensors().items()})


def simulated(layout: Layout, costs) -> list[dict]:
    """Per pipeline stage, what the simulator books for one rank of this layout on the course GPT:
    ring bytes sent per axis (``sim.step.traffic``) and model-state bytes (``static_bytes``)."""
    import sim
    from sim.calibration.fit_local import gpt_model
    from sim.planning.advice import cluster_of
    from sim.step import traffic
    from sim.step.memory_timeline import static_bytes

    model = gpt_model(dataclasses.asdict(lab.CFG))
    plan = sim.Plan(tp=layout.tp, pp=layout.pp, dp=layout.dp, zero_stage=layout.zero_stage,
                    micro_batch_size=GLOBAL_BATCH // (layout.dp * MICROBATCHES), num_microbatches=MICROBATCHES,
                    precision="fp32", framework="zero_ref", gradient_clipping=1.0 if layout.zero_stage else 0.0)
    run = sim.simulate(model, cluster_of("A100-80GB", layout.world), plan, costs, granularity="layer")
    states = static_bytes(model, plan)["gpu"]
    memory = {"params": states["param"], "grads": states["grad"], "optimizer": states["optim"]}
    return [dict(sends={a: sum(traffic.bytes_sent(run.graph, plan, axes=(a,), stage=s).values()) for a in AXES},
                 memory=memory) for s in range(layout.pp)]


def plot_plans(result, best, run, limit: float, hbm: float, budget: dict, deadline: float):
    """Three panels: the searched plans (step time against peak memory, by ZeRO stage and offload) with the usable
    limit and the chosen plan; the chosen plan's GPU memory over one step (``run``, a SimResult); the days to the
    token budget for each (GPU, count) of ``budget`` ({(gpu, n): (row, days)}) against the deadline."""
    import matplotlib.pyplot as plt
    from sim.views.render import memory_stack
    from zero_ref.memory import GiB

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [1, 1.3, 1]})
    ax = axes[0]
    simulated = [row for row in result.rows if row.step_time is not None]   # the others: pruned or skipped by a bound
    names = {"none": "", "cpu": " + offload to CPU", "nvme": " + offload to NVMe"}
    for z in sorted({row.plan.zero_stage for row in simulated}):
        for offload, marker in (("none", "o"), ("cpu", "^"), ("nvme", "s")):
            rs = [row for row in simulated if row.plan.zero_stage == z and row.plan.offload_optimizer == offload]
            if rs:
                ax.scatter([row.peak_bytes / GiB for row in rs], [row.step_time for row in rs], s=28, color=f"C{z}",
                           marker=marker, label=f"ZeRO-{z}{names[offload]}")
    ax.scatter([best.peak_bytes / GiB], [best.step_time], s=200, marker="*", color="gold", edgecolor="black",
               zorder=3, label="chosen")
    ax.axvline(result.memory_limit / GiB, color="grey", ls="--", lw=1, label="usable limit (90 % of HBM)")
    ax.set(xlabel="peak GPU memory (GiB)", ylabel="simulated step time (s)")
    ax.set_title("the searched plans", fontsize=10)
    ax.legend(fontsize=7, loc="center left")
    memory_stack(run, ax=axes[1], legend="short")
    axes[1].axhline(limit / GiB, color="grey", lw=1, ls="--", label="usable limit")
    axes[1].set_ylim(0, hbm / GiB)
    axes[1].set_title("the chosen plan: GPU memory over one step", fontsize=10)
    axes[1].legend(fontsize=7, loc="upper right", ncol=3)
    ax, counts = axes[2], sorted({n for _, n in budget})
    for k, gpu in enumerate(dict.fromkeys(g for g, _ in budget)):
        ax.bar([i + 0.4 * k for i in range(len(counts))], [budget[gpu, n][1] for n in counts], width=0.4, label=gpu)
    ax.set_xticks([i + 0.2 for i in range(len(counts))], [f"{n} GPUs" if i == 0 else str(n) for i, n in enumerate(counts)])
    ax.axhline(deadline, color="red", ls="--", lw=1, label="deadline")
    ax.set_ylabel("days to 20 B tokens")
    ax.set_title("the budget", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
