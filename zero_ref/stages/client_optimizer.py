"""A client's torch optimizer stepped on a stage's partition, as DeepSpeed steps one that is not Adam.

DeepSpeed's ZeRO optimizer points each of the client optimizer's param groups at this rank's flat fp32
partition, sets its ``.grad`` and calls the optimizer's own ``step()`` (runtime/zero/stage_1_and_2.py:
``param_group['params'] = [self.single_partition_of_fp32_groups[i]]``, ``_optimizer_step``; stage3.py,
``_optimizer_step``). Here each param group's run of a bucket's partition is one flat fp32 tensor in
that group, so the optimizer keeps state for this rank's 1/N of the elements only. At stage 0, where
DeepSpeed hands the parameters themselves to the optimizer, each parameter gets one tensor of its own
shape (a view of the fp32 master): an optimizer that reads a whole tensor (a norm) sees what it would see
in DeepSpeed.

    groups = client_groups(module, optimizer)       # the optimizer's own dicts: schedules write them
    client = PartitionedOptimizer(optimizer, stage)  # after the stage has built its partitions
    client.step(grads)                               # fp32 gradients, unscaled and clipped

State the optimizer built before (torch's Adagrad fills its sums at construction) is moved onto the
tensors it now steps: per-element state is sliced and joined, a value shared by a whole tensor (a step
count) is kept if every parameter of the tensor agrees. ``flat_state``, ``shared_state`` and ``load_state``
give it per bucket and per group for checkpoints (zero_ref.checkpoint).
"""
from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn as nn

from zero_ref.stages.param_groups import trainable_params


def client_groups(module: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list[dict], dict[int, int]]:
    """The optimizer's param groups (the same dicts: a schedule's writes reach its step) and parameter id →
    group index; every trainable parameter of the module is in exactly one group."""
    group_of: dict[int, int] = {}
    for i, g in enumerate(optimizer.param_groups):
        for p in g["params"]:
            if id(p) in group_of:
                raise ValueError(f"{type(optimizer).__name__}: a parameter of shape {tuple(p.shape)} is in param "
                                 f"groups {group_of[id(p)]} and {i}; each parameter belongs to one group")
            group_of[id(p)] = i
    trainable = {id(p) for p in trainable_params(module)}
    if set(group_of) != trainable:
        raise ValueError(f"{type(optimizer).__name__}'s param groups must hold exactly the module's trainable "
                         f"parameters: {len(trainable - set(group_of))} missing, "
                         f"{len(set(group_of) - trainable)} not trainable or not the module's")
    return optimizer.param_groups, group_of


class Span:
    """One tensor the optimizer steps: elements [start, end) of bucket ``bucket``'s partition (shaped
    ``shape`` at stage 0), made of the parameter slices ``pieces`` = [(param, first, end)]."""

    def __init__(self, bucket: int, start: int, end: int, group: int, shape, pieces: list):
        self.bucket, self.start, self.end, self.group = bucket, start, end, group
        self.shape, self.pieces = shape, pieces
        self.tensor: torch.Tensor | None = None


def spans_of(stage) -> list[Span]:
    """The tensors ``stage``'s optimizer steps, bucket by bucket: a parameter each at stage 0, else this rank's
    shard cut where the param group changes (padding is not stepped)."""
    out = []
    for k, b in enumerate(stage.buckets):
        group = [stage._group_of[id(p)] for p in b.params]
        if stage.stage == 0:
            out += [Span(k, s, s + n, group[i], shape, [(b.params[i], 0, n)])
                    for i, (s, n, shape) in enumerate(zip(b.layout.offsets, b.layout.numels, b.layout.shapes))]
            continue
        last = None
        for pc in b.layout.pieces(stage.rank):
            start, g = pc.shard_start, group[pc.index]
            if last is not None and last.group == g and last.end == start:
                last.end += pc.numel
                last.pieces.append((b.params[pc.index], pc.param_start, pc.param_end))
            else:
                last = Span(k, start, start + pc.numel, g, None, [(b.params[pc.index], pc.param_start, pc.param_end)])
                out.append(last)
    return out


def _scalar(v) -> bool:
    return not isinstance(v, torch.Tensor) or v.dim() == 0


def _same(values: list) -> bool:
    first = values[0]
    if isinstance(first, torch.Tensor):
        return all(isinstance(v, torch.Tensor) and torch.equal(v, first) for v in values)
    return all(v == first for v in values)


class PartitionedOptimizer:
    """``optimizer`` re-pointed at ``stage``'s partitions (``spans_of``); ``step`` runs its own step there."""

    def __init__(self, optimizer: torch.optim.Optimizer, stage):
        self.optimizer, self.name = optimizer, type(optimizer).__name__
        self.spans = spans_of(stage)
        self.masters = [b.partition.master for b in stage.buckets]
        old, state = optimizer.state, defaultdict(dict)
        for s in self.spans:
            flat = self.masters[s.bucket][s.start:s.end]
            s.tensor = flat.view(s.shape) if s.shape is not None else flat
            moved = self._move(old, s)
            if moved:
                state[s.tensor] = moved
        for i, g in enumerate(optimizer.param_groups):
            g["params"] = [s.tensor for s in self.spans if s.group == i]
        optimizer.state = state

    def _move(self, old, s: Span) -> dict:
        """The state ``old`` holds for the parameter slices of span ``s``, as the state of ``s.tensor``."""
        have = [old[p] for p, _, _ in s.pieces if p in old and old[p]]
        if not have:
            return {}
        if len(have) != len(s.pieces):
            raise ValueError(f"{self.name} holds state for some parameters and not for others; zero_ref steps "
                             "them together on its partition: build the optimizer fresh, before initialize")
        out = {}
        for key in have[0]:
            values = [st.get(key) for st in have]
            if all(isinstance(v, torch.Tensor) and v.numel() == p.numel() and v.dim() > 0
                   for v, (p, _, _) in zip(values, s.pieces)):
                t = torch.cat([v.reshape(-1)[a:b] for v, (_, a, b) in zip(values, s.pieces)])
                t = t.to(self.masters[s.bucket].device, torch.float32 if t.is_floating_point() else t.dtype)
                out[key] = t.view(s.shape) if s.shape is not None else t
            elif all(_scalar(v) for v in values) and _same(values):
                out[key] = values[0].clone() if isinstance(values[0], torch.Tensor) else values[0]
            else:
                raise ValueError(f"{self.name}'s state {key!r} is neither one value per element nor one value per "
                                 "parameter alike for all of them, so zero_ref cannot partition it over ranks")
        return out

    def step(self, grads: list[torch.Tensor]) -> None:
        """The optimizer's own step over this rank's spans; ``grads[k]`` is bucket k's fp32 gradient partition
        (averaged, unscaled and clipped). The hyper-parameters are its param groups' at this moment."""
        for s in self.spans:
            g = grads[s.bucket][s.start:s.end]
            s.tensor.grad = g.view(s.shape) if s.shape is not None else g
        try:
            self.optimizer.step()
        finally:
            for s in self.spans:
                s.tensor.grad = None

    def state_tensors(self) -> list[torch.Tensor]:
        """The tensors the optimizer holds (what its state costs this rank)."""
        return [v for st in self.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]

    # ---------------------------------------------------------------- checkpoints
    def flat_state(self, k: int, numel: int) -> dict[str, torch.Tensor]:
        """Bucket ``k``'s per-element state as ``numel``-long tensors over its partition (zeros where no span is)."""
        flats: dict[str, torch.Tensor] = {}
        for s in self.spans:
            if s.bucket != k:
                continue
            for key, v in self.optimizer.state.get(s.tensor, {}).items():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    if v.numel() != s.end - s.start:
                        raise ValueError(f"{self.name}'s state {key!r} has {v.numel()} elements for a tensor of "
                                         f"{s.end - s.start}: a checkpoint keeps per-element state only")
                    flats.setdefault(key, torch.zeros(numel, dtype=v.dtype, device=v.device))[s.start:s.end] = \
                        v.reshape(-1)
        return flats

    def shared_state(self) -> list[dict]:
        """Per param group, the state values shared by a whole tensor (a step count), from this rank's spans."""
        shared: list[dict] = [{} for _ in self.optimizer.param_groups]
        for s in self.spans:
            for key, v in self.optimizer.state.get(s.tensor, {}).items():
                if not isinstance(v, torch.Tensor) or v.dim() == 0:
                    shared[s.group][key] = v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v
        return shared

    def load_state(self, k: int, flats: dict[str, torch.Tensor], shared: list[dict]) -> None:
        """Bucket ``k``'s state from ``flat_state``'s and ``shared_state``'s shapes (read from a checkpoint)."""
        for s in self.spans:
            if s.bucket != k:
                continue
            device = self.masters[k].device
            st = {key: v[s.start:s.end].clone().to(device) for key, v in flats.items()}
            st = {key: t.view(s.shape) if s.shape is not None else t for key, t in st.items()}
            st.update({key: v.clone() if isinstance(v, torch.Tensor) else v  # (torch keeps step counts on the host)
                       for key, v in shared[s.group].items()})
            self.optimizer.state.pop(s.tensor, None)
            if st:
                self.optimizer.state[s.tensor] = st
