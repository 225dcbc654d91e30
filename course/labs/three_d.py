"""Lab: a small GPT trained end to end with 3D parallelism (tp × pp × dp) and ZeRO-1, on CPU ranks.

    torchrun --nproc-per-node 8 -m course.labs.three_d --tp 2 --pp 2 --steps 40 --out loss.json

dp = world size / (tp · pp). The model is a byte-level GPT (vocabulary 256) trained on this
course's chapter titles and goals (course/labs/corpus.txt, English and Chinese as UTF-8 bytes): real
text, so the loss falls; a fixed file, so the lab's curve does not move when the course is edited.
Every rank builds the same model (same seed); ``ThreeD`` keeps this rank's tensor-parallel shard of its pipeline stage and puts ZeRO-1 over the data-parallel group.

Rank 0 writes the loss curve (JSON) and prints it. ``--check`` also trains the single-process model
on the same batches on rank 0 and prints ``OK`` when ``verdict`` accepts the run: every step's loss within
``LOSS_TOL`` of one process and every rank's parameters within ``PARAM_TOL`` of their part of it. The ranks
add in other orders than one process (tensor-parallel partial sums, micro-batches, the data-parallel
reduce-scatter), so the two agree to rounding, not to the bit. At lr 2e-3 the default 40 steps stay near
1e-5 in the loss; at lr 3e-3 the loss jumps at step 16, a step at the edge of stability that amplifies
those rounding differences to 5e-2 by step 40, and no tolerance would tell a correct run from a wrong one.

    torchrun --nproc-per-node 8 -m course.labs.three_d --tp 2 --pp 2 --steps 40 --check

``--save DIR`` writes a sharded checkpoint (after ``--save-at`` steps, default the last); ``--resume DIR``
continues from one. ``run(rank, world, **options)`` is the same lab as a function, for ``zero_ref.launch``
(the chapter 22 notebook calls it); its ``step`` option trains with another step function than
``ThreeD.train_step`` (chapter 22's Task 22.2).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from zero_ref import comm
from zero_ref.measure import unique_storage_bytes
from zero_ref.models import GPT, GPTConfig
from zero_ref.optim import AdamConfig
from zero_ref.parallel.groups import build_groups
from zero_ref.parallel.topology import Topology
from zero_ref.recipes.three_d import ThreeD

TEXT = Path(__file__).resolve().parent / "corpus.txt"
CFG = GPTConfig(vocab_size=256, seq_len=32, d_model=64, n_heads=4, n_layers=4)
ADAM = AdamConfig(lr=2e-3, weight_decay=0.1, eps=1e-6)
LOSS_TOL, PARAM_TOL = 1e-4, 1e-3  # measured at 40 steps: 1.2e-5 and 3.9e-5


def corpus() -> torch.Tensor:
    return torch.tensor(list(TEXT.read_bytes()), dtype=torch.long)


def batch(data: torch.Tensor, step: int, size: int, seq_len: int = CFG.seq_len):
    """The global batch of ``step``: ``size`` random windows of the text (the same on every rank)."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, len(data) - seq_len - 1, (size,), generator=g)
    windows = torch.stack([data[s:s + seq_len + 1] for s in start.tolist()])
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def build_model(seed: int = 0, cfg: GPTConfig = CFG) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg)


def reference(steps: int, global_batch: int, first_step: int = 0) -> tuple[list[float], dict]:
    """One process, torch.optim.AdamW on the whole global batch: the run 3D must reproduce."""
    data, model = corpus(), build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=ADAM.lr, betas=ADAM.betas, eps=ADAM.eps,
                            weight_decay=ADAM.weight_decay, foreach=False)
    losses = []
    for step in range(first_step, first_step + steps):
        _, loss = model(*batch(data, step, global_batch))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def run(rank: int, world: int, *, tp: int = 2, pp: int = 2, steps: int = 40, global_batch: int = 16,
        microbatches: int = 4, schedule: str = "1f1b", virtual: int = 1, check: bool = False,
        save: str | None = None, save_at: int | None = None, resume: str | None = None, step=None,
        reference_state: dict | None = None, cfg: GPTConfig = CFG) -> dict:
    """Train; every rank returns its losses, step times, memory and communication bytes.

    ``step(trainer, idx, targets) -> (StepStats, global loss)``: one optimizer step on the global batch
    (default ``ThreeD.train_step``). ``reference_state``: one process's state_dict after the same steps,
    trained by the caller; every rank returns ``max_param_diff`` against it (``check`` trains it on rank 0).
    ``cfg``: another shape of the byte-level GPT (vocabulary 256), for runs without ``check``."""
    if cfg.vocab_size != 256:
        raise ValueError(f"three_d.run: the text is bytes, so cfg.vocab_size must be 256, got {cfg.vocab_size}")
    if check and cfg != CFG:
        raise ValueError("three_d.run: check trains the reference on the lab's CFG; leave cfg at its default")
    topo = Topology.for_world(world, tp=tp, pp=pp)
    pg = build_groups(topo)
    trainer = ThreeD(build_model(cfg=cfg), pg, microbatches=microbatches, schedule=schedule, virtual=virtual, adam=ADAM)
    if resume:
        trainer.load_checkpoint(resume)
    data, first, step_fn = corpus(), trainer.global_steps, step
    losses, times = [], []
    axes = {axis: set(topo.group_of(axis, rank)) for axis in ("tp", "pp", "dp")}
    by_axis = {"tp": 0.0, "pp": 0.0, "dp": 0.0}

    def count(op, tensor, group):  # ring bytes of the training steps, on the axis whose group carried each call
        if tensor is None or (group is None and op != "send"):  # a barrier; the loss over all ranks
            return
        n = 2 if op == "send" else dist.get_world_size(group)
        axis = "pp" if op == "send" else next(a for a, g in axes.items() if g == set(dist.get_process_group_ranks(group)))
        by_axis[axis] += comm.ring_wire_bytes(op, tensor.numel() * tensor.element_size(), n)

    with comm.recording() as log:
        for step in range(first, first + steps):
            t0 = time.perf_counter()
            with comm.hooked(count):
                if step_fn is None:
                    stats, loss = trainer.train_step(*batch(data, step, global_batch, cfg.seq_len))
                else:
                    stats, loss = step_fn(trainer, *batch(data, step, global_batch, cfg.seq_len))
            if step_fn is not None:
                trainer.global_steps += 1
            times.append(time.perf_counter() - t0)
            losses.append(loss)
            if save and step + 1 - first == (save_at or steps):
                out_checkpoint = trainer.save_checkpoint(save)
    out = dict(rank=rank, coords=tuple(pg.coords), first_step=first, loss=losses, step_time_s=times,
               bubble_idle_s=(stats.end - stats.start) - stats.busy, comm=log.by_op(),
               ring_bytes_by_axis={a: b / steps for a, b in by_axis.items()},
               memory={k: unique_storage_bytes(v) for k, v in trainer.optimizer.state_tensors().items()},
               local_params=sum(p.numel() for _, p in trainer.named_parameters() if p.requires_grad))
    if check:  # rank 0 trains the reference and sends it to everyone; each rank compares its pieces
        ref_model = build_model()
        names = list(ref_model.state_dict())
        if rank == 0:
            out["reference_loss"], ref = reference(steps, global_batch, first)
            flat = torch.cat([ref[k].reshape(-1) for k in names])
        else:
            flat = torch.empty(sum(v.numel() for v in ref_model.state_dict().values()))
        comm.broadcast(flat, src=0)
        ref, at = {}, 0
        for k, v in ref_model.state_dict().items():
            ref[k], at = flat[at:at + v.numel()].view_as(v), at + v.numel()
        worst = torch.tensor([trainer.max_diff(ref)])
        comm.all_reduce(worst, op="max")
        out["max_param_diff"] = worst.item()
    elif reference_state is not None:
        worst = torch.tensor([trainer.max_diff(reference_state)])
        comm.all_reduce(worst, op="max")
        out["max_param_diff"] = worst.item()
    if save:
        out["checkpoint"] = out_checkpoint
    return out


def verdict(losses: list[float], reference_losses: list[float], max_param_diff: float) -> str:
    """'OK' when the run follows one process to LOSS_TOL at every step and PARAM_TOL in every parameter."""
    dloss = max(abs(a - b) for a, b in zip(losses, reference_losses, strict=True))
    return "OK" if dloss <= LOSS_TOL and max_param_diff <= PARAM_TOL else "MISMATCH"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved"])
    ap.add_argument("--virtual", type=int, default=1)
    ap.add_argument("--check", action="store_true", help="compare with a single-process run (rank 0)")
    ap.add_argument("--save", help="write a sharded checkpoint to this folder")
    ap.add_argument("--save-at", type=int, help="after this many steps (default: at the end)")
    ap.add_argument("--resume", help="continue from the checkpoint in this folder")
    ap.add_argument("--out", default="three_d_loss.json", help="the loss curve, as JSON (rank 0)")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    res = run(rank, world, tp=args.tp, pp=args.pp, steps=args.steps, global_batch=args.global_batch,
              microbatches=args.microbatches, schedule=args.schedule, virtual=args.virtual, check=args.check,
              save=args.save, save_at=args.save_at, resume=args.resume)
    if rank == 0:
        dp = world // (args.tp * args.pp)
        curve = dict(tp=args.tp, pp=args.pp, dp=dp, zero_stage=1, schedule=args.schedule, virtual=args.virtual,
                     microbatches=args.microbatches, global_batch=args.global_batch,
                     steps=list(range(res["first_step"], res["first_step"] + args.steps)),
                     loss=res["loss"], step_time_s=res["step_time_s"])
        for k in ("reference_loss", "max_param_diff"):
            if k in res:
                curve[k] = res[k]
        Path(args.out).write_text(json.dumps(curve, indent=1))
        print(f"tp={args.tp} pp={args.pp} dp={dp} zero=1 schedule={args.schedule} steps={args.steps}")
        print("loss: " + " ".join(f"{x:.3f}" for x in res["loss"]))
        print(f"loss curve written to {args.out}")
        if args.check:
            dloss = max(abs(a - b) for a, b in zip(res["loss"], res["reference_loss"]))
            print(f"max |loss - single-process loss| = {dloss:.2e}")
            print(f"max |parameter - single-process parameter| over all ranks = {res['max_param_diff']:.2e}")
            print(verdict(res["loss"], res["reference_loss"], res["max_param_diff"]))
    dist.barrier()  # leave together: gloo torn down on one rank while another still works can abort it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
