"""A watchdog for collectives: a rank stuck in one reports what every rank of its group last called.

A hang in data-parallel training is almost always a collective that one rank calls and another
never does (different control flow on different ranks), or calls differently. Neither torch nor
gloo says which. Inside ``with watch_collectives(timeout=...):``

- every ``zero_ref.comm`` call first records (op, its number on that group, shape and dtype, the
  calling line in zero_ref and in user code, async or not) in memory; the watchdog thread writes
  this rank's records to the process group's store (the launcher's TCPStore; torchrun's under
  torchrun) every ``PUBLISH_S`` seconds when they changed, so the calling thread never waits for
  a store round trip;
- a watchdog thread looks at the calling thread every ``poll`` seconds: inside a ``zero_ref.comm``
  function (or, after an async call, on a line waiting on a handle) with no progress for ``timeout``
  seconds, it reads every peer's record from the store, prints a report that names each rank's
  last call on that group and a diagnosis (a rank never issued call #k; call #k differs), and ends
  the process with ``EXIT_CODE`` — a thread blocked in C++ cannot be interrupted, and the launcher
  then fails at once, the report in the rank's stderr (``timeout_report`` extracts it);
- ``check=True`` publishes each call's header and waits for the group's before issuing it, so a
  mismatch raises ``CollectiveMismatch`` on every rank before the collective can hang or crash
  (gloo aborts a rank whose received size differs), at the price of a store round trip per call.
"""
from __future__ import annotations

import json
import linecache
import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

from zero_ref import comm

EXIT_CODE = 3  # how a rank ends when its watchdog fires
PUBLISH_S = 0.05  # the store holds each rank's records at most this old (except with check=True: current)
_BEGIN, _END = "=== zero_ref: collective timeout ===", "=== end of report ==="
_COMM_FILE = comm.__file__
_PKG = os.path.dirname(_COMM_FILE)


class CollectiveError(RuntimeError):
    """A collective failed; the message says what each rank of its group last called."""


class CollectiveTimeout(CollectiveError):
    """A collective did not start or finish within the timeout; the message says where each rank is."""


class CollectiveMismatch(CollectiveError):
    """Ranks are about to run different collectives on one group (``watch_collectives(check=True)``)."""


_STATES = {"running": "busy, not waiting in a collective", "waiting": "waiting in it",
           "timed out here": "timed out waiting in it", "this rank": "this rank"}


def _frame(f) -> str:
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} ({f.f_code.co_name})"


def _describe(rec: dict) -> str:
    return f"{rec['op']} #{rec['n']} ({rec['shape']}{', async' if rec['async'] else ''}) from {rec['at']}"


class _Watch:
    def __init__(self, timeout: float, check: bool, poll: float, session: int):
        self.timeout, self.check, self.poll = timeout, check, poll
        self.prefix = f"zero_ref/watch/{session}"  # a fresh key space per block: no stale peer records
        self.rank, self.store = dist.get_rank(), dist.distributed_c10d._get_default_store()
        self.calls, self.last, self.groups = {}, {}, {}  # group key → calls on it / its last record / ranks
        self.current, self.thread, self.state = None, threading.get_ident(), "running"
        self._stop, self._published = threading.Event(), -1  # calls made when the store was last written

    def _group(self, group) -> str:
        if id(group) not in self.groups:
            ranks = dist.get_process_group_ranks(dist.group.WORLD if group is None else group)
            self.groups[id(group)] = ",".join(map(str, ranks))
        return self.groups[id(group)]

    def hook(self, op: str, tensor, group) -> None:
        """Called by zero_ref.comm before every call: count it, note where it came from, publish it."""
        f = sys._getframe(2)  # the zero_ref.comm function; async_op is one of its arguments
        is_async = op in ("send", "recv") and f.f_code.co_name.startswith("i") or bool(f.f_locals.get("async_op"))
        while f is not None and f.f_code.co_filename == _COMM_FILE:
            f = f.f_back
        at = _frame(f)
        user = f
        while user is not None and (user.f_code.co_filename.startswith(_PKG) or "/torch/" in user.f_code.co_filename):
            user = user.f_back
        if user is not None and user is not f:
            at += f" <- {_frame(user)}"
        g = "p2p" if op in ("send", "recv") else self._group(group)
        k = self.calls[g] = self.calls.get(g, 0) + 1
        shape = "-" if tensor is None else f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"
        rec = self.last[g] = {"op": op, "n": k, "shape": shape, "async": is_async, "at": at}
        self.current, self.thread, self.state = g, threading.get_ident(), "running"
        if self.check and g != "p2p":
            self._publish()
            self._agree(g, rec)
        # else the watchdog thread writes it to the store within PUBLISH_S: no round trip on this thread

    def _publish(self) -> None:
        self._published = sum(self.calls.values())
        state = {"calls": dict(self.calls), "last": dict(self.last), "state": self.state}  # a snapshot
        self.store.set(f"{self.prefix}/{self.rank}", json.dumps(state))

    def _peer(self, q: int) -> dict | None:
        key = f"{self.prefix}/{q}"
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def _agree(self, g: str, rec: dict) -> None:
        """check=True: every rank of the group publishes call #k and compares before issuing it."""
        ranks, k = [int(r) for r in g.split(",")], rec["n"]
        keys = [f"{self.prefix}/{g}/{k}/{q}" for q in ranks]
        self.store.set(keys[ranks.index(self.rank)], json.dumps(rec))
        try:
            self.store.wait(keys, timedelta(seconds=self.timeout))
        except RuntimeError:
            raise CollectiveTimeout(self.report()) from None
        heads = {q: json.loads(self.store.get(key)) for q, key in zip(ranks, keys)}
        if k > 1:
            self.store.delete_key(f"{self.prefix}/{g}/{k - 1}/{self.rank}")  # every peer is past call k-1
        # Shapes must match except in all_to_all (uneven splits are legal there).
        sig = {q: (h["op"], "" if h["op"] == "all_to_all" else h["shape"]) for q, h in heads.items()}
        if len(set(sig.values())) > 1:
            raise CollectiveMismatch(f"call #{k} on ranks [{g.replace(',', ', ')}] differs between ranks: " + "; ".join(
                f"rank {q} {h['op']} ({h['shape']}) from {h['at']}" for q, h in heads.items()))

    def report(self, how: str = "") -> str:
        """Where this rank waits and what every rank of that group last called on it."""
        g, me = self.current, self.last[self.current]
        where = "point-to-point" if g == "p2p" else f"ranks [{g.replace(',', ', ')}]"
        how = how or f"waited more than {self.timeout:g} s in"
        lines = [f"rank {self.rank} {how} {me['op']} #{me['n']} on {where}"]
        behind, differ, ahead = [], [], []
        for q in ([self.rank] if g == "p2p" else [int(r) for r in g.split(",")]):
            peer = {"calls": self.calls, "last": self.last, "state": "this rank"} if q == self.rank else self._peer(q)
            if peer is None:
                lines.append(f"  rank {q}: no record (not watching, or no collective yet)")
                continue
            c, last = peer["calls"].get(g, 0), peer["last"].get(g)
            lines.append(f"  rank {q}: {_describe(last) if last else 'no call here yet'}; "
                         f"{_STATES.get(peer['state'], peer['state'])}")
            if c < me["n"]:
                behind.append(str(q))
            elif c > me["n"]:
                ahead.append(str(q))
            elif (last["op"], last["shape"]) != (me["op"], me["shape"]):
                differ.append(f"rank {q} {last['op']} ({last['shape']})")
        if behind:
            lines.append(f"diagnosis: rank {', '.join(behind)} never issued call #{me['n']} on {where}: different "
                         "control flow on different ranks (a collective skipped, a loop that ran fewer times, "
                         "an early exit)")
        elif differ:
            lines.append(f"diagnosis: call #{me['n']} differs: rank {self.rank} {me['op']} ({me['shape']}) vs "
                         + ", ".join(differ))
        elif ahead:
            lines.append(f"diagnosis: rank {', '.join(ahead)} made more calls on {where}: "
                         "an earlier call was mismatched")
        elif g != "p2p":
            lines.append("diagnosis: every rank issued this call and it did not complete (a dead or stuck peer)")
        return "\n".join(lines)

    def _blocked(self) -> bool:
        """Is the watched thread inside a zero_ref.comm call, or waiting on the handle of an async one?"""
        f = sys._current_frames().get(self.thread)
        top = f
        while f is not None:
            if f.f_code.co_filename == _COMM_FILE:
                return True
            f = f.f_back
        rec = self.last.get(self.current)
        return bool(top and rec and rec["async"]
                    and ".wait(" in linecache.getline(top.f_code.co_filename, top.f_lineno))

    def run(self) -> None:
        """Publish this rank's record when it changes; every ``poll`` s, check for a stuck collective."""
        since, seen, next_check = None, None, time.monotonic()
        while not self._stop.wait(min(PUBLISH_S, self.poll)):
            if sum(self.calls.values()) != self._published:
                self._publish()
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + self.poll
            f = sys._current_frames().get(self.thread)
            now = (sum(self.calls.values()), id(f), f.f_lineno if f else None)  # progress resets the clock
            if not self._blocked() or now != seen:
                since, seen = time.monotonic(), now
            elif time.monotonic() - since >= self.timeout / 2 and self.state == "running":
                self.state = "waiting"  # so a peer's report can tell "stuck here too" from "busy elsewhere"
                self._publish()
            elif time.monotonic() - since >= self.timeout * (2 if self.check else 1) and not self._stop.is_set():
                # (with check=True the store wait raises first, as a Python exception; this is the backstop)
                self.state = "timed out here"
                self._publish()
                sys.stderr.write(f"\n{_BEGIN}\n{self.report()}\n{_END}\n")
                sys.stderr.flush()
                os._exit(EXIT_CODE)  # the thread stuck in C++ cannot be interrupted; end the rank


_active: list[_Watch] = []
_sessions = [0]  # watched blocks entered by this process (the same count on every rank)


@contextmanager
def watch_collectives(timeout: float = 60.0, *, check: bool = False, poll: float | None = None):
    """Within the block, a rank stuck in a zero_ref.comm collective for ``timeout`` seconds prints a report
    (between ``=== zero_ref: collective timeout ===`` lines, on stderr) naming what each rank of that group
    last called, and exits with code ``EXIT_CODE``. ``check=True`` also compares each call's op and shape
    across the group before issuing it (one store round trip and a wait per call: a debugging mode)
    and raises ``CollectiveMismatch`` on every rank, or ``CollectiveTimeout`` if a peer never issues it.

    Cost otherwise: a few microseconds per call on this thread (the store writes happen on the
    watchdog's). Set ``timeout`` above the longest legitimate wait
    (a slow peer, a checkpoint written by one rank while the others wait in a barrier).
    """
    if not dist.is_initialized():
        raise ValueError("watch_collectives needs an initialised process group (zero_ref.launch or torchrun)")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if _active:
        raise ValueError("watch_collectives is already active in this process")
    _sessions[0] += 1
    w = _Watch(float(timeout), check, poll or min(1.0, timeout / 10), _sessions[0])
    _active.append(w)
    thread = threading.Thread(target=w.run, name="zero_ref-watchdog", daemon=True)
    thread.start()
    try:
        with comm.hooked(w.hook):
            yield w
        w.state = "left the watched block"
    except BaseException as e:
        w.state = "raised an exception"
        if isinstance(e, RuntimeError) and not isinstance(e, CollectiveError) and _raised_in_comm(e):
            w.state = "failed in a collective"  # e.g. gloo's "Connection reset by peer": a peer died mid-call
            raise CollectiveError(f"{type(e).__name__} in a collective: {str(e)[:200]}\n{w.report('failed in')}") from e
        raise
    finally:
        _active.remove(w)
        w._stop.set()
        thread.join()
        w._publish()  # after the thread's last write, so the final state is the one peers read


def _raised_in_comm(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != _COMM_FILE:
        tb = tb.tb_next
    return tb is not None


def timeout_report(error, sanitize: bool = True) -> str:
    """The watchdog's report inside a launch error (or any text); ``sanitize`` drops line numbers and
    names a notebook cell's file ``<cell>``, so the text is the same from run to run."""
    text = str(error)
    if _BEGIN in text:
        text = text.split(_BEGIN, 1)[1].split(_END, 1)[0].strip("\n")
    if sanitize:
        text = re.sub(r"([\w.<>-]+\.py):\d+", lambda m: ("<cell>" if m[1][:-3].isdigit() else m[1]) + ":N", text)
    return text


