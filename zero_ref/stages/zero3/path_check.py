"""Every rank takes the same path through the model: ZeRO-3's check of its collectives on units.

Different control flow on different ranks (a block skipped on one rank, an expert unused on one rank)
would mismatch collectives: NCCL hangs, gloo aborts the process on a size mismatch. So the ranks
compare headers (position in the micro-step, unit, op) and all raise the same error, naming every
rank's module, if they differ.

While no order is known (the first micro-steps, or after the order changed), the ranks exchange a
header before each collective and wait for it. Once a micro-step has run checked, its sequence of
collectives is the expectation for the next, and a rank on that path sends nothing extra: the ranks
exchange one header at the micro-step's end. A rank that leaves the path knows it (its next
collective is not the expected one); it runs the rest of the expected collectives on scratch
buffers, so the others' collectives still meet matching ones, and then sends its header, which the
others read in their end-of-micro-step exchange. Every rank then raises the same error, naming what
each rank did at the first position where they differ. The error comes before the optimizer step, so
no update is applied. If every rank left the path in the same way (a changed but common control
flow), there is no error, and the check exchanges headers before each collective again until a
micro-step has run checked.

DeepSpeed compares the ranks' module order once, when the first step's trace is recorded
(runtime/zero/partitioned_param_coordinator.py, ``reset_step``), and per collective only under
``safe_mode`` / ``enable_sanity_checks`` (``assert_ints_same_as_other_ranks``).
"""
from __future__ import annotations

from typing import Callable

import torch

from zero_ref import comm

END = (-1, -1)  # what a rank "runs" at its micro-step's end
FORWARD, PREFETCH, BACKWARD, REDUCE = range(4)  # what a collective on a unit is for (the header's op)
_VERBS = {FORWARD: ("gathers", "gather", " for forward"), PREFETCH: ("prefetches", "prefetch", ""),
          BACKWARD: ("gathers", "gather", " for backward"),
          REDUCE: ("reduce-scatters", "reduce-scatter", "'s gradient")}


def same_collective(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Headers ``a`` and ``b`` name the same collective: the same unit, both all-gathers or both reduce-scatters."""
    return (a[0], a[1] == REDUCE) == (b[0], b[1] == REDUCE)


def different_paths(did: list[tuple[int, int]], names: list[str]) -> str:
    """The error when the ranks' collectives differ: ``did[r]`` is rank r's (unit, op) where they part;
    ``names[i]``: unit i's name."""
    ranks: dict[tuple, list[int]] = {}
    for r, key in enumerate(did):
        ranks.setdefault(key, []).append(r)
    said = " while ".join(_say(key, rs, names) for key, rs in ranks.items())
    return (f"ZeRO-3: the ranks took different paths through the model: {said}. Every rank must call the "
            "same modules in the same order (a block skipped on one rank, an expert unused on one rank, "
            "generation stopping at different lengths all break this); otherwise their collectives would "
            "not match and training would hang.")


def _say(key: tuple[int, int], ranks: list[int], names: list[str]) -> str:
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    if key == END:
        return f"{who} {'has' if len(ranks) == 1 else 'have'} no more modules in this micro-step"
    i, o = key
    verb = _VERBS[o][0] if len(ranks) == 1 else _VERBS[o][1]
    return f"{who} {verb} '{names[i]}'{_VERBS[o][2]}"


class PathCheck:
    """``run_like(key)`` issues the collective ``key`` = (unit, op) names on scratch buffers and returns its
    work; ``same(a, b)``: keys ``a`` and ``b`` are the same collective; ``explain(keys)``: the error's text,
    from what each rank (by index) does at the first position where the ranks differ."""

    def __init__(self, group, world_size: int, device, run_like: Callable, same: Callable, explain: Callable):
        self.group, self.world_size, self.device = group, world_size, device
        self.run_like, self.same, self.explain = run_like, same, explain
        self.expected: list[tuple[int, int]] | None = None  # the last checked micro-step's collectives
        self.seq: list[tuple[int, int]] = []                # this micro-step's, so far
        self.followed = True                                # no rank left the expected path this micro-step

    def announce(self, key: tuple[int, int]) -> None:
        """Before this rank's collective ``key``: check that every rank runs the same one."""
        if self.world_size == 1:
            return
        pos = len(self.seq)
        self.seq.append(key)
        if self.expected is None or pos >= len(self.expected):
            self._compare(pos, key)  # no expectation (or past its end): header before the collective
        elif key != self.expected[pos]:
            self._leave(pos, key)

    def end(self, keep: bool) -> None:
        """The micro-step's end on every rank. Its collectives become the next micro-step's expectation if
        ``keep`` (a steady micro-step) and no rank left the path."""
        if self.world_size == 1:
            return
        pos = len(self.seq)
        if self.expected is not None and pos < len(self.expected):
            self._leave(pos, END)  # fewer collectives than expected
        else:
            self._compare(pos, END)
        self.expected = self.seq if keep and self.followed else None
        self.seq, self.followed = [], True

    def drop(self) -> None:
        """After a failed backward: forget the micro-step; the next one checks before each collective."""
        self.expected, self.seq, self.followed = None, [], True

    def _leave(self, pos: int, key) -> None:
        """This rank's ``pos``-th collective is ``key``, not the expected one: run what the others run, then
        compare (raises unless every rank left the path the same way here)."""
        for k in self.expected[pos:]:
            self.run_like(k).wait()
        self._compare(pos, key)
        self.expected, self.followed = None, False

    def _compare(self, pos: int, key) -> None:
        rows = torch.empty(3 * self.world_size, dtype=torch.int64, device=self.device)
        comm.all_gather(rows, torch.tensor([pos, *key], dtype=torch.int64, device=self.device), group=self.group)
        rows = [(p, (u, o)) for p, u, o in rows.view(-1, 3).tolist()]
        first = min(p for p, _ in rows)
        if all(p == first and self.same(k, rows[0][1]) for p, k in rows):
            return
        # A rank whose header is from later in the micro-step ran the expected collective at ``first``.
        did = [k if p == first else self.expected[first] for p, k in rows]
        raise RuntimeError(self.explain(did))
