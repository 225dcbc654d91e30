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

A rank counts as finished when it has *returned*: its result is written to a file before the
process tears down. torch 2.13's gloo sometimes aborts in teardown after all work is done
("terminate called without an active exception"); such a rank's result stands. A rank that dies
before writing a result is always a failure, whatever its exit code.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta

import cloudpickle

from zero_ref import forkserver

_HOST = "127.0.0.1"
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

    store = dist.TCPStore(_HOST, 0, world_size + 1, is_master=True, wait_for_workers=False,
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
                procs.append(forks.fork(argv, env, _path(workdir, r, "exit")) if forks else subprocess.Popen(
                    [sys.executable, "-c", "from zero_ref.launcher import _rank_main; _rank_main()", *argv],
                    env=env, stdin=subprocess.DEVNULL, start_new_session=True))  # own process group
            _watch(procs, workdir, timeout)
            results = [_load(workdir, r) for r in range(world_size)]
            if echo:
                _echo(workdir, world_size)
            return results
        finally:
            _reap(procs)
            del store


# ------------------------------------------------------------------ parent side


def _path(workdir: str, rank: int, kind: str) -> str:
    return os.path.join(workdir, f"rank{rank}.{kind}")


def _watch(procs, workdir: str, timeout: float) -> None:
    """Block until every rank returned; raise on the first failure or at the deadline."""
    n = len(procs)
    deadline = time.monotonic() + timeout
    while True:
        returned = [r for r in range(n) if os.path.exists(_path(workdir, r, "result"))]
        failed = _failures(procs, workdir)
        if failed:
            first = failed[0]
            _reap(procs)
            raise RankError(first[1], first[2], others=[r for _, r, _ in failed[1:]])
        if len(returned) == n:
            _join_finished(procs)
            return
        if time.monotonic() > deadline:
            _reap(procs)
            unfinished = [r for r in range(n) if r not in returned]
            tails = {r: _tail(_path(workdir, r, "stderr")) for r in unfinished}
            raise RankTimeout(unfinished, returned, timeout, tails)
        time.sleep(0.02)


def _failures(procs, workdir: str) -> list[tuple[float, int, str]]:
    """Ranks that raised (error file) or died without a result, ordered by when they failed."""
    out = []
    for r, p in enumerate(procs):
        err = _path(workdir, r, "error")
        if os.path.exists(err):
            with open(err) as f:
                out.append((os.path.getmtime(err), r, f.read()))
        elif p.poll() is not None and not os.path.exists(_path(workdir, r, "result")):
            code = p.returncode
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            details = f"the process {how} before returning a result.\n{_tail(_path(workdir, r, 'stderr'))}"
            out.append((time.time(), r, details))
    return sorted(out)


def _join_finished(procs) -> None:
    # Finished ranks are in teardown; an abort there does not undo a written result.
    end = time.monotonic() + _TEARDOWN_GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


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
    with open(_path(workdir, rank, "result"), "rb") as f:
        return pickle.load(f)


def _echo(workdir: str, world_size: int) -> None:
    for r in range(world_size):
        with open(_path(workdir, r, "stdout")) as f:
            text = f.read()
        for line in text.splitlines():
            print(f"[rank {r}] {line}")


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except FileNotFoundError:
        return ""


# ------------------------------------------------------------------ child side


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # the parent never sees a half-written result


def _redirect(path: str, fd: int) -> None:
    # At the file-descriptor level, so C++ (gloo) output is captured too.
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _exit_with_parent(parent_pid: int) -> None:
    def watch():
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _rank_main():
    workdir, rank, world_size, port, backend, threads, pg_timeout_s, parent_pid = sys.argv[1:]
    rank, world_size, port, threads, parent_pid = map(int, (rank, world_size, port, threads, parent_pid))
    pg_timeout_s = float(pg_timeout_s)
    _exit_with_parent(parent_pid)
    _redirect(_path(workdir, rank, "stdout"), 1)
    _redirect(_path(workdir, rank, "stderr"), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.update(MASTER_ADDR=_HOST, MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    status = 1
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        with open(os.path.join(workdir, "payload.pkl"), "rb") as f:
            fn, args = cloudpickle.loads(f.read())
        timeout = timedelta(seconds=pg_timeout_s)
        store = dist.TCPStore(_HOST, port, is_master=False, timeout=timeout)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        result = fn(rank, world_size, *args)
        try:
            data = pickle.dumps(result)
        except Exception:
            data = cloudpickle.dumps(result)
        _write_atomic(_path(workdir, rank, "result"), data)
        status = 0
        # Leave only when every rank has returned, so no peer loses bytes still in flight to us.
        store.set(f"zero_ref/returned/{rank}", "1")
        store.wait([f"zero_ref/returned/{r}" for r in range(world_size)])
        dist.destroy_process_group()
    except BaseException:
        if status != 0:
            _write_atomic(_path(workdir, rank, "error"), traceback.format_exc().encode())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
