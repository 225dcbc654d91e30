"""3D parallelism: tensor × pipeline × data-parallel ranks, with ZeRO-1 over the data-parallel group.

Every rank sits at one point (t, d, p) of the ``Topology`` grid and belongs to one group per axis:

- its **tp** group shards every layer (``zero_ref.parallel.tensor``): all-reduces inside each block;
- its **pp** group is a pipeline (``zero_ref.parallel.pipeline``): it holds stage p of the model
  (tp-shard t of it) and sends activations to the rank with the same t and d in stage p + 1;
- its **dp** group holds the same shard of the same stage: the ranks split the batch, and ZeRO-1
  partitions the optimizer states of that shard among them (reduce-scatter of the gradients in
  the pipeline's last backward, Adam on 1/dp of the states, all-gather of the parameters).

    topo = Topology(tp=2, pp=2, dp=2)
    pg = build_groups(topo)                          # every rank, same topology
    trainer = ThreeD(model, pg, microbatches=4)      # model: the same single-device GPT on every rank
    stats, loss = trainer.train_step(idx, targets)   # the global batch; this rank takes its slice

ZeRO-2 and ZeRO-3 are refused with pipeline parallelism, as DeepSpeed refuses them
(``zero_ref.parallel.pipeline.ZERO_WITH_PP`` says why).
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn

from zero_ref import checkpoint, comm
from zero_ref.models.gpt import GPT
from zero_ref.optim import AdamConfig
from zero_ref.parallel.groups import ParallelGroups
from zero_ref.parallel.pipeline import ZERO_WITH_PP, Pipeline, StepStats, split_gpt
from zero_ref.parallel.tensor import TensorParallelGPT, local_part
from zero_ref.stages import STAGES


class ThreeD:
    """This rank's share of a GPT trained with tp × pp × dp parallelism and ZeRO-``zero_stage`` over dp.

    ``model``: the single-device GPT, identical on every rank (same seed); this rank keeps tp-shard t
    of pipeline stage p (``virtual`` chunks of it with the interleaved schedule). ``adam``: the
    optimizer, as ``zero_ref.stages`` runs it (AdamW arithmetic, op for op).
    """

    def __init__(self, model: GPT, groups: ParallelGroups, *, microbatches: int, schedule: str = "1f1b",
                 virtual: int = 1, zero_stage: int = 1, adam: AdamConfig | None = None,
                 costs: str | list[float] = "params", gradient_clipping: float = 0.0):
        topo = groups.topology
        if zero_stage not in STAGES:
            raise ValueError(f"ThreeD: zero_stage must be one of {sorted(STAGES)}, got {zero_stage!r}")
        if zero_stage >= 2:
            raise ValueError(ZERO_WITH_PP.format(stage=zero_stage))
        if gradient_clipping:
            raise ValueError("ThreeD: gradient_clipping needs the gradient norm over the tensor- and pipeline-"
                             "parallel groups too (each rank holds part of the model); it is not implemented here")
        self.groups, self.topology = groups, topo
        self.t, self.d, self.p = groups.coords
        full = TensorParallelGPT(model, groups.tp) if topo.tp > 1 else model
        self.chunks = split_gpt(full, topo.pp * virtual, costs)[self.p::topo.pp]
        self.module = nn.ModuleList(self.chunks)
        self.optimizer = STAGES[zero_stage](self.module, adam=adam, group=groups.dp)
        self.pipeline = Pipeline(self.chunks, self.p, groups.ranks("pp"), schedule=schedule,
                                 microbatches=microbatches)
        self.microbatches = microbatches
        self.global_steps = 0  # what zero_ref.checkpoint reads and restores

    def my_micro_batches(self, idx: torch.Tensor, targets: torch.Tensor) -> list:
        """This data-parallel rank's slice of the global batch, cut into the pipeline's micro-batches."""
        dp, m = self.topology.dp, self.microbatches
        if idx.shape[0] % (dp * m):
            raise ValueError(f"ThreeD: the global batch ({idx.shape[0]}) must divide into dp × micro-batches "
                             f"= {dp} × {m} equal micro-batches")
        n = idx.shape[0] // dp
        mine = slice(self.d * n, (self.d + 1) * n)
        return list(zip(idx[mine].chunk(m), targets[mine].chunk(m)))

    def train_step(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[StepStats, float]:
        """One optimizer step on the global batch ``(idx, targets)``; returns this rank's pipeline
        statistics and the global mean loss (the same on every rank)."""
        stats = self.pipeline.train_step(self.my_micro_batches(idx, targets), optimizer=self.optimizer)
        self.optimizer.step()
        self.global_steps += 1
        # The last stage's tp-rank 0 of each data-parallel replica holds its replica's loss.
        mine = stats.loss if (stats.loss is not None and self.t == 0) else 0.0
        loss = torch.tensor([mine / self.topology.dp], dtype=torch.float64)
        comm.all_reduce(loss)
        return stats, loss.item()

    def named_parameters(self):
        """(name in the single-device GPT, parameter) for every parameter this rank holds."""
        for chunk in self.chunks:
            yield from chunk.gpt_state_dict(keep_vars=True).items()

    def max_diff(self, reference: dict[str, torch.Tensor]) -> float:
        """Largest |this rank's parameter − its part of the single-device ``reference`` state dict|."""
        worst = 0.0
        for name, p in self.named_parameters():
            want = local_part(p, reference[name], self.groups.tp) if self.topology.tp > 1 else reference[name]
            worst = max(worst, (p.detach() - want).abs().max().item())
        return worst

    # ZeRO checkpoints are per data-parallel group: each (tp, pp) shard of the model has its own
    # folder, which its dp ranks write together (zero_ref.checkpoint: atomic, readable at any dp size).
    def _folder(self, root: str) -> str:
        return os.path.join(root, f"tp{self.t:02d}_pp{self.p:02d}")

    def save_checkpoint(self, save_dir: str, tag=None) -> str:
        """Every rank writes its shard of its stage's optimizer states; a collective over each dp group."""
        return checkpoint.save(self, self._folder(save_dir), tag)

    def load_checkpoint(self, load_dir: str, tag=None) -> str | None:
        """Restore parameters, optimizer states and the step count saved by ``save_checkpoint``."""
        return checkpoint.load(self, self._folder(load_dir), tag)[0]
