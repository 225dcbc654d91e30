"""Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes and collect the results.

    results = zero_ref.launch(fn, 4, batch)      # [fn(0, 4, batch), ..., fn(3, 4, batch)]

Each rank is its own Python process joined to a real ``torch.distributed`` process group
(gloo on CPU, NCCL on GPUs), forked from a process that has imported torch already
(``zero_ref.forkserver``), so a launch costs milliseconds rather than an import of torch per
rank. ``fn`` travels with cloudpickle, so it may be defined in a notebook cell or in a script
without an ``if __name__ == "__main__"`` guard (the ranks never re-import the caller's main
module, unlike multiprocessing's spawn). The parent holds the rendezvous store (a TCPStore on a
free port chosen by the OS, so concurrent launches never collide) and watches the ranks:

- a rank that raises fails the call at once with that rank's traceback (``RankError``);
- ranks still running after ``timeout`` seconds — typically waiting on a collective a peer never
  calls — fail the call naming them (``RankTimeout``);
- either way every rank (and anything it started) is killed before the call returns.

A rank counts as finished when it has *returned*: its result is written to a file, then it leaves the
process group and exits with ``os._exit``, without interpreter finalization, where gloo's workers can
abort a finished process (``zero_ref.clean_exit`` says why). A rank that dies before writing a result,
or is killed by a signal after writing it (an abort in teardown), is a failure.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import cloudpickle

from zero_ref import forkserver
from zero_ref.launch_rank import HOST, rank_file

_TEARDOWN_GRACE_S = 10.0  # how long finished ranks get to exit before they are killed


class LaunchError(RuntimeError):
    """A multi-rank launch failed."""


class RankError(LaunchError):
    """A rank raised or died; ``rank`` is the first one that failed, ``details`` its traceback."""

    def __init__(self, rank: int, details: str, others: list[int] | None = None):
        self.rank, self.details, self.others = rank, details, others or []
        also = f" (ranks {self.others} failed after it)" if self.others else ""
        super().__init__(f"rank {rank} failed{also}:\n{details}")


class RankTimeout(LaunchError):
    """Ranks did not finish in time; ``unfinished`` lists them, ``finished`` those that returned."""

    def __init__(self, unfinished: list[int], finished: list[int], timeout: float, tails: dict[int, str]):
        self.unfinished, self.finished, self.timeout = unfinished, finished, timeout
        msg = (f"ranks {unfinished} did not finish within {timeout:g} s"
               f" (ranks {finished} returned). A rank still running is usually waiting on a collective"
               " that another rank never called (different control flow on different ranks).")
        for rank, tail in tails.items():
            if tail.strip():
                msg += f"\n--- rank {rank} stderr (last lines) ---\n{tail}"
        super().__init__(msg)


def launch(fn, world_size: int, *args, timeout: float = 300.0, backend: str = "gloo",
           threads: int = 1, echo: bool = True) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return results in rank order.

    ``threads`` sets torch's intra-op threads per rank (1 avoids oversubscribing a small machine).
    ``echo`` prints what each rank wrote to stdout, rank by rank, after the ranks finish (so a
    notebook cell shows it in a deterministic order).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    import torch.distributed as dist

    store = dist.TCPStore(HOST, 0, world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout + 60))
    with tempfile.TemporaryDirectory(prefix="zero_ref_launch_") as workdir:
        with open(os.path.join(workdir, "payload.pkl"), "wb") as f:
            f.write(cloudpickle.dumps((fn, args)))
        # The ranks see the caller's import path, so functions pickled by reference resolve.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        forks = forkserver.server(env)  # torch imported once, ranks forked from it (None: fresh interpreters)
        procs = []
        try:
            for r in range(world_size):
                argv = [str(a) for a in (workdir, r, world_size, store.port, backend, threads, timeout + 60,
                                         forks.pid if forks else os.getpid())]  # a rank exits when this one does
                procs.append(forks.fork(argv, env, rank_file(workdir, r, "exit")) if forks else subprocess.Popen(
                    [sys.executable, "-c", "from zero_ref.launch_rank import run_rank; run_rank()", *argv],
                    env=env, stdin=subprocess.DEVNULL, start_new_session=True))  # own process group
            _watch(procs, workdir, timeout)
            results = [_load(workdir, r) for r in range(world_size)]
            if echo:
                _echo(workdir, world_size)
            return results
        finally:
            _reap(procs)
            del store


def _watch(procs, workdir: str, timeout: float) -> None:
    """Block until every rank returned; raise on the first failure or at the deadline."""
    n = len(procs)
    deadline = time.monotonic() + timeout
    while True:
        returned = [r for r in range(n) if os.path.exists(rank_file(workdir, r, "result"))]
        failed = _failures(procs, workdir)
        if failed:
            first = failed[0]
            _reap(procs)
            raise RankError(first[1], first[2], others=[r for _, r, _ in failed[1:]])
        if len(returned) == n:
            _join_finished(procs, workdir)
            return
        if time.monotonic() > deadline:
            _reap(procs)
            unfinished = [r for r in range(n) if r not in returned]
            tails = {r: _tail(rank_file(workdir, r, "stderr")) for r in unfinished}
            raise RankTimeout(unfinished, returned, timeout, tails)
        time.sleep(0.02)


def _failures(procs, workdir: str) -> list[tuple[float, int, str]]:
    """Ranks that raised (error file) or died without a result, ordered by when they failed."""
    out = []
    for r, p in enumerate(procs):
        err = rank_file(workdir, r, "error")
        if os.path.exists(err):
            with open(err) as f:
                out.append((os.path.getmtime(err), r, f.read()))
        elif p.poll() is not None and not os.path.exists(rank_file(workdir, r, "result")):
            code = p.returncode
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            details = f"the process {how} before returning a result.\n{_tail(rank_file(workdir, r, 'stderr'))}"
            out.append((time.time(), r, details))
    return sorted(out)


def _join_finished(procs, workdir: str) -> None:
    """Wait for the returned ranks to exit; one killed by a signal in teardown fails the call."""
    end = time.monotonic() + _TEARDOWN_GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for r, p in enumerate(procs):
        if (p.poll() or 0) < 0:
            _reap(procs)
            raise RankError(r, f"the rank returned its result, then its process was killed by "
                               f"{signal.Signals(-p.returncode).name} in teardown.\n"
                               f"{_tail(rank_file(workdir, r, 'stderr'))}")


def _reap(procs) -> None:
    """Kill every rank's process group (the rank and anything it started) and wait for it."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass


def _load(workdir: str, rank: int):
    with open(rank_file(workdir, rank, "result"), "rb") as f:
        return pickle.load(f)


def _echo(workdir: str, world_size: int) -> None:
    for r in range(world_size):
        with open(rank_file(workdir, r, "stdout")) as f:
            text = f.read()
        for line in text.splitlines():
            print(f"[rank {r}] {line}")


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except FileNotFoundError:
        return ""
