"""Every rank takes the same path through the model: ZeRO-3's check before each collective on a unit.

Different control flow on different ranks (a block skipped on one rank, an expert unused on one rank)
would mismatch collectives: NCCL hangs, gloo aborts the process on a size mismatch. So before each
collective on a unit the ranks exchange a 16-byte header (unit, op) and all raise the same error,
naming every rank's module, if they differ. At the end of each micro-step they exchange an *end*
header, which catches a rank that ran fewer or more unit collectives than the others.

Synchronously (header, wait, compare, then the collective), that is one more round trip per
collective. Once a micro-step has run checked, its sequence of collectives is the expectation for the
next: a rank on the expected path sends the header *with* its collective, without waiting (the
headers are compared when the next one is sent, or before anything waits on a collective); a rank
that leaves the path sends its header inside the collective the others are running (``run_like``, on
scratch buffers), so sizes still match, and raises. The others read its header and raise the same
error. If every rank left the path the same way (a changed but common control flow), the check goes
back to synchronous headers until a micro-step has run checked again.

DeepSpeed compares the ranks' module order once, when the first step's trace is recorded
(runtime/zero/partitioned_param_coordinator.py, ``reset_step``), and per collective only under
``safe_mode`` / ``enable_sanity_checks`` (``assert_ints_same_as_other_ranks``).
"""
from __future__ import annotations

from typing import Callable

import torch

from zero_ref import comm

END = (-1, -1)  # the header of a micro-step's end


class PathCheck:
    """``check(rows)`` raises if the ranks' headers ``rows`` (one (unit, op) per rank) name different
    collectives; ``run_like(key)`` issues the collective ``key`` names on scratch buffers and returns its work."""

    def __init__(self, group, world_size: int, device, check: Callable, run_like: Callable):
        self.group, self.world_size, self.device = group, world_size, device
        self.check, self.run_like = check, run_like
        self.expected: list[tuple[int, int]] | None = None  # the last checked micro-step's collectives
        self.seq: list[tuple[int, int]] = []                # this micro-step's, so far
        self.followed = True                                # no rank left the expected path this micro-step
        self.headers: list[tuple] = []                      # (work, rows) sent and not yet compared

    def announce(self, key: tuple[int, int]) -> None:
        """Before this rank's collective ``key``: check it is the one every rank runs."""
        if self.world_size == 1:
            return
        pos = len(self.seq)
        self.seq.append(key)
        exp = self.expected[pos] if self.expected is not None and pos < len(self.expected) else None
        if exp is None:  # no expectation: header, wait, compare
            self.settle(block=True)
            self.check(self._exchange(key))
        elif exp == key:  # on the path: the header travels with the collective the caller issues next
            self.settle(block=False)
            rows = self._new_rows()
            self.headers.append((comm.all_gather(rows, self._header(key), group=self.group, async_op=True), rows))
        else:  # off the path: say so inside the collective the others are running
            rows = self._new_rows()
            self.headers.append((comm.all_gather(rows, self._header(key), group=self.group, async_op=True), rows))
            work = self.run_like(exp)
            self.settle(block=True)  # raises unless every rank left the path the same way
            work.wait()
            self.expected, self.followed = None, False

    def settle(self, block: bool) -> None:
        """Compare the headers sent so far, in order (``block=False``: those already arrived). Call it before
        waiting on any collective: a rank that raised will never join the collectives after its header."""
        while self.headers:
            work, rows = self.headers[0]
            if not block and not work.is_completed():
                return
            work.wait()
            self.headers.pop(0)
            self.check(_per_rank(rows))

    def end(self, keep: bool) -> None:
        """The micro-step's end on every rank: compare what is pending and the end headers; its collectives
        become the next micro-step's expectation if ``keep`` (a steady micro-step) and no rank left the path."""
        if self.world_size == 1:
            return
        self.settle(block=True)
        self.check(self._exchange(END))
        self.expected = self.seq if keep and self.followed else None
        self.seq, self.followed = [], True

    def drop(self) -> None:
        """After a failed backward: forget what is pending; the next micro-step checks synchronously."""
        self.headers.clear()
        self.expected, self.seq, self.followed = None, [], True

    def _header(self, key) -> torch.Tensor:
        return torch.tensor(key, dtype=torch.int64, device=self.device)

    def _new_rows(self) -> torch.Tensor:
        return torch.empty(2 * self.world_size, dtype=torch.int64, device=self.device)

    def _exchange(self, key) -> list[tuple[int, int]]:
        rows = self._new_rows()
        comm.all_gather(rows, self._header(key), group=self.group)
        return _per_rank(rows)


def _per_rank(rows: torch.Tensor) -> list[tuple[int, int]]:
    return [tuple(r) for r in rows.view(-1, 2).tolist()]
