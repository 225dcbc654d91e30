"""Pipeline parallelism on real ranks: stages, the GPipe / 1F1B / interleaved / ZB-H1 schedules, bubbles.

The model is cut into p·v contiguous *virtual stages*; pipeline rank s holds virtual stages
s, s + p, …, s + (v − 1)·p (its v *chunks*; v = 1 without interleaving). A step cuts the batch into
m micro-batches, and each rank runs its schedule's list of forwards (F) and backwards (B; in ZB-H1
only the input gradient, the weight gradient following later as W, see ``zero_bubble``):

    stages = split_gpt(model, p * v)                     # every rank builds the same full model
    pipe = Pipeline(stages[rank::p], rank, ranks, schedule="1f1b", microbatches=m)
    stats = pipe.train_step(micro_batches)               # [(idx, targets)] × m; then optimizer.step()

Activations go forward and their gradients backward with real point-to-point sends
(``zero_ref.comm``). Sends never block (``isend``), so a rank only waits in a receive, for an
input its schedule needs next; the schedules are ordered so those waits always end. Each rank
times its compute (``perf_counter`` around every F, B and W); the rest of the step is its share of
the bubble, and ``measured_bubble`` puts the stages together.

Gradients accumulate over the m micro-batches; a data-parallel optimizer (a ``zero_ref.stages``
stage with ``gradient_accumulation_steps=1``) reduces them *during the last backward* of the
step (picotron's placement; ZB-H1 after the schedule). With tied embeddings the first and last stages each hold a copy of
the word embedding; their gradients are summed between the two stages first, and only then
reduced over data-parallel ranks (DeepSpeed's ReduceTiedGrads, then ReduceGrads).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from zero_ref import comm
from zero_ref.measure import saved_activation_bytes
from zero_ref.parallel.partition import GPTStage, partition, split_gpt  # noqa: F401  (re-exported)
from zero_ref.parallel.schedules import check_schedule, stage_order
from zero_ref.parallel.zero_bubble import input_backward, weight_backward

ZERO_WITH_PP = (
    "ZeRO stage {stage} cannot be combined with pipeline parallelism here (DeepSpeed's PipelineEngine refuses "
    "it too: 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'). A pipeline stage runs one "
    "backward per micro-batch, m per step. ZeRO-1 accumulates them in its full gradient buffer and reduces once "
    "per step; ZeRO-2 keeps only its gradient shard, so it reduces after every micro-batch: m reductions "
    "instead of one, (m+1)/2 times ZeRO-1's data-parallel bytes with reduce-scatters, (2m+1)/3 with "
    "DeepSpeed's bucket all-reduces. ZeRO-3 would also all-gather the stage's parameters in every "
    "micro-batch's forward and backward: 2m gathers instead of one. This is a design choice, not a law: "
    "FSDP runs under pipelines (Llama 3 405B trained with 16 stages) by keeping more unsharded between "
    "micro-batches. Use ZeRO-1 (stage=1) over the data-parallel group.")


# --------------------------------------------------------------------------- running a step


@dataclass(frozen=True)
class Op:
    """One F, B or W on this rank: perf_counter seconds (one clock for all local processes)."""

    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float
    sync: bool = False  # this backward also reduced the gradients over data-parallel ranks (timed with it)


@dataclass
class StepStats:
    """What one pipeline rank did in a step: its ops, loss, busy time and in-flight activations."""

    stage: int
    ops: list[Op] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0           # the end of the schedule (before the tied/data-parallel sync after it)
    losses: list[float] = field(default_factory=list)  # per micro-batch, on the last stage
    peak_in_flight: int = 0    # micro-batches whose activations were held at once
    peak_activation_bytes: int = 0  # their saved-for-backward bytes (with measure_memory=True)
    sync: str = "none"         # 'last backward', 'after schedule' or 'none'

    @property
    def busy(self) -> float:
        return sum(o.end - o.start for o in self.ops)

    @property
    def loss(self) -> float | None:
        return sum(self.losses) / len(self.losses) if self.losses else None


def measured_bubble(stats: list[StepStats]) -> float:
    """Idle share of the step over the pipeline's stages: 1 − Σ busy / (p × (last end − first start))."""
    span = max(s.end for s in stats) - min(s.start for s in stats)
    return 1.0 - sum(s.busy for s in stats) / (len(stats) * span)


def mean_op_times(stats: list[StepStats], kinds: str = "FB") -> tuple[float, ...]:
    """Mean seconds of one op of each of ``kinds`` over every stage: the simulator's t_f, t_b (, t_w)."""
    out = []
    for kind in kinds:
        d = [o.end - o.start for s in stats for o in s.ops if o.kind == kind]
        out.append(sum(d) / len(d))
    return tuple(out)


class Pipeline:
    """This rank's part of a pipeline: its chunks, its peers, and the schedule that drives them.

    ``chunks[c]`` is virtual stage c·p + ``stage``; ``ranks`` the global ranks of the pipeline
    group in stage order. A chunk's ``activation_shape(batch, seq)`` gives the shape of the
    hidden states passed between stages (``GPTStage`` has one). ``group``: the ranks that start
    each step together (a barrier; default all ranks).
    """

    def __init__(self, chunks: list[nn.Module], stage: int, ranks: list[int], *, schedule: str = "1f1b",
                 microbatches: int, group=None, measure_memory: bool = False):
        self.p, self.v, self.m = len(ranks), len(chunks), microbatches
        check_schedule(schedule, self.p, microbatches, self.v)
        if not 0 <= stage < self.p:
            raise ValueError(f"Pipeline: stage {stage} outside 0..{self.p - 1}")
        self.chunks, self.stage, self.ranks, self.schedule = list(chunks), stage, list(ranks), schedule
        self.group, self.measure_memory = group, measure_memory
        self.last = self.p * self.v - 1
        self.order = stage_order(schedule, self.p, microbatches, stage, self.v)
        # Tied embeddings (split_gpt untied them): the word embedding of virtual stage 0 and the
        # head of the last virtual stage are two copies whose gradients must be summed.
        cfg = getattr(self.chunks[0], "cfg", None)
        self.tied = None
        if cfg is not None and cfg.tie_embeddings and self.p * self.v > 1:
            if stage == 0:
                self.tied = self.chunks[0].tok_emb.weight
            elif stage == self.p - 1:
                self.tied = self.chunks[-1].head.weight

    # ------------------------------------------------------------ point to point
    def _vs(self, chunk: int) -> int:
        return chunk * self.p + self.stage

    def _expected_from(self, peer: int) -> deque:
        """Keys of the messages ``peer`` will send this rank, in the order it sends them (its own
        schedule). Receiving in that order needs no tags: early arrivals wait in the inbox."""
        q = deque()
        for kind, i, c in stage_order(self.schedule, self.p, self.m, peer, self.v):
            if kind == "W":  # a weight-gradient pass sends nothing
                continue
            vs = c * self.p + peer
            to = vs + 1 if kind == "F" else vs - 1  # activations go forward, their gradients back
            if 0 <= to <= self.last and to % self.p == self.stage:
                q.append((kind, i, to))
        return q

    def _send(self, t: torch.Tensor, key: tuple, to_vs: int) -> None:
        if tuple(t.shape) != self.act_shape:
            raise ValueError(f"pipeline: virtual stage {key[2]} produced a tensor of shape {tuple(t.shape)}, but the "
                             f"stages pass activations of shape {self.act_shape}")
        dst = to_vs % self.p
        if dst == self.stage:  # a chunk of this same rank (p = 1): no message
            self.inbox[(key[0], key[1], to_vs)] = t.detach()
        else:
            t = t.detach().contiguous()
            self.pending.append((comm.isend(t, self.ranks[dst]), t))

    def _recv(self, key: tuple, from_stage: int) -> torch.Tensor:
        while key not in self.inbox:
            nxt = self.expected[from_stage].popleft()
            buf = torch.empty(self.act_shape)
            comm.recv(buf, self.ranks[from_stage])
            self.inbox[nxt] = buf
        return self.inbox.pop(key)

    def _handshake(self, shape: tuple) -> None:
        """Each stage tells the next its micro-batch shape, so a mismatch is an error, not a hang."""
        if self.p == 1:
            return
        mine = torch.tensor([*shape, self.m, self.act_shape[-1]], dtype=torch.int64)
        peer = torch.empty_like(mine)
        work = comm.isend(mine, self.ranks[(self.stage + 1) % self.p])
        comm.recv(peer, self.ranks[(self.stage - 1) % self.p])
        work.wait()
        if not torch.equal(mine, peer):
            raise ValueError(f"pipeline: stage {self.stage} has micro-batches (batch, seq), m, hidden = "
                             f"{mine.tolist()} but stage {(self.stage - 1) % self.p} has {peer.tolist()}")

    # ------------------------------------------------------------ a step
    def train_step(self, micro_batches: list, optimizer=None) -> StepStats:
        """Forward and backward of m micro-batches by the schedule; gradients accumulate in .grad.

        ``micro_batches``: m (idx, targets) pairs (the first stage reads idx, the last targets).
        ``optimizer``: a ``zero_ref.stages`` optimizer over this rank's chunks with
        ``gradient_accumulation_steps=1``; it reduces the gradients over data-parallel ranks in
        the step's last backward. Call its ``step()`` afterwards (or step your own optimizer).
        """
        if len(micro_batches) != self.m:
            raise ValueError(f"pipeline: expected {self.m} micro-batches, got {len(micro_batches)}")
        shapes = {tuple(x.shape) for mb in micro_batches for x in mb}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise ValueError(f"pipeline: every micro-batch's idx and targets must have one (batch, seq) shape, got {shapes}")
        if optimizer is not None:
            if getattr(optimizer, "stage", 0) >= 2:
                raise ValueError(ZERO_WITH_PP.format(stage=optimizer.stage))
            if getattr(optimizer, "gas", 1) != 1:
                raise ValueError("pipeline: build the optimizer with gradient_accumulation_steps=1; the pipeline "
                                 f"accumulates over its {self.m} micro-batches itself")
        shape = next(iter(shapes))
        self.act_shape = tuple(self.chunks[0].activation_shape(*shape))
        self._handshake(shape)
        self.inbox, self.pending = {}, []
        self.expected = {peer: self._expected_from(peer) for peer in {(self.stage - 1) % self.p, (self.stage + 1) % self.p}}
        comm.barrier(group=self.group)  # start together: the bubble is measured from here
        stats = StepStats(self.stage, start=time.perf_counter())
        stash, live, pending_w = {}, 0, {}
        split = self.schedule == "zb-h1"  # B: input gradients only; W: weight gradients
        # ZB-H1 reduces after the schedule: torch's W pass sets .grad directly, past the optimizer's gradient hooks
        sync_in_backward = optimizer is not None and self.tied is None and not split
        for n, (kind, i, c) in enumerate(self.order):
            vs = self._vs(c)
            if kind == "F":
                x = micro_batches[i][0] if vs == 0 else self._recv(("F", i, vs), (self.stage - 1) % self.p)
                x = x if vs == 0 else x.requires_grad_()
                t0 = time.perf_counter()
                out, nbytes = self._forward(self.chunks[c], x, micro_batches[i][1] if vs == self.last else None)
                if vs == self.last:
                    stats.losses.append(out.item())
                    out = out / self.m  # the step's loss is the mean over micro-batches
                stats.ops.append(Op("F", i, c, t0, time.perf_counter()))
                if vs != self.last:
                    self._send(out, ("F", i, vs), vs + 1)
                stash[(i, c)] = (x, out, nbytes)
                live += nbytes
                stats.peak_in_flight = max(stats.peak_in_flight, len(stash))
                stats.peak_activation_bytes = max(stats.peak_activation_bytes, live)
            elif kind == "W":
                x, out, nbytes = stash.pop((i, c))
                t0 = time.perf_counter()
                weight_backward(pending_w.pop((i, c)))
                stats.ops.append(Op("W", i, c, t0, time.perf_counter()))
                live -= nbytes
            elif split:
                x, out, _ = stash[(i, c)]  # held until its W
                grad = None if vs == self.last else self._recv(("B", i, vs), (self.stage + 1) % self.p)
                params = [q for q in self.chunks[c].parameters() if q.requires_grad]
                t0 = time.perf_counter()
                pending_w[(i, c)] = input_backward(out, grad, x if vs > 0 else None, params)
                stats.ops.append(Op("B", i, c, t0, time.perf_counter()))
                if vs > 0:
                    self._send(x.grad, ("B", i, vs), vs - 1)
            else:
                x, out, nbytes = stash.pop((i, c))
                grad = None if vs == self.last else self._recv(("B", i, vs), (self.stage + 1) % self.p)
                sync = sync_in_backward and n == len(self.order) - 1
                t0 = time.perf_counter()
                if sync:  # a scalar whose gradient w.r.t. out is grad: the optimizer's backward reduces
                    optimizer.backward(out if grad is None else (out * grad).sum())
                else:
                    torch.autograd.backward(out, grad)
                stats.ops.append(Op("B", i, c, t0, time.perf_counter(), sync))
                live -= nbytes
                if vs > 0:
                    self._send(x.grad, ("B", i, vs), vs - 1)
        stats.end = time.perf_counter()
        if self.tied is not None:
            self._sum_tied_grads()
        if optimizer is not None:
            stats.sync = "last backward" if sync_in_backward else "after schedule"
            if not sync_in_backward:  # a backward through nothing: the optimizer just reduces what accumulated
                optimizer.backward(torch.zeros((), requires_grad=True))
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
        return stats

    def _forward(self, chunk: nn.Module, x: torch.Tensor, targets):
        if not self.measure_memory:
            return chunk(x, targets), 0
        with saved_activation_bytes(chunk) as saved:
            out = chunk(x, targets)
        return out, saved.total

    def _sum_tied_grads(self) -> None:
        """First and last stage add each other's word-embedding gradient (a + b = b + a, bit for bit)."""
        g = self.tied.grad
        if g is None:
            g = self.tied.grad = torch.zeros_like(self.tied)
        if self.p == 1:  # both copies on this rank: chunk 0's embedding and the last chunk's head
            other = self.chunks[-1].head.weight
            total = g + other.grad
            g.copy_(total)
            other.grad.copy_(total)
            return
        peer = self.ranks[self.p - 1 if self.stage == 0 else 0]
        theirs = torch.empty_like(g)
        work = comm.isend(g.clone(), peer)
        comm.recv(theirs, peer)
        work.wait()
        g.add_(theirs)
