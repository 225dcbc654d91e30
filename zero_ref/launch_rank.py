"""A launched rank's own process: join the process group, run ``fn``, leave its result in the work folder.

``zero_ref.launcher`` starts it (forked by ``zero_ref.forkserver``, or as a fresh interpreter) and reads
the files it writes: ``rank{r}.result`` (pickled) or ``rank{r}.error`` (the traceback), and its stdout
and stderr.
"""
from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from datetime import timedelta

import cloudpickle

HOST = "127.0.0.1"


def rank_file(workdir: str, rank: int, kind: str) -> str:
    """The file of ``rank``'s ``kind`` (result, error, stdout, stderr, exit) in the launch's work folder."""
    return os.path.join(workdir, f"rank{rank}.{kind}")


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


def run_rank() -> None:
    """A rank's process: ``argv`` from ``launch``; joins the group, runs ``fn``, writes its result or traceback."""
    workdir, rank, world_size, port, backend, threads, pg_timeout_s, parent_pid = sys.argv[1:]
    rank, world_size, port, threads, parent_pid = map(int, (rank, world_size, port, threads, parent_pid))
    pg_timeout_s = float(pg_timeout_s)
    _exit_with_parent(parent_pid)
    _redirect(rank_file(workdir, rank, "stdout"), 1)
    _redirect(rank_file(workdir, rank, "stderr"), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    status = 1
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        with open(os.path.join(workdir, "payload.pkl"), "rb") as f:
            fn, args = cloudpickle.loads(f.read())
        timeout = timedelta(seconds=pg_timeout_s)
        store = dist.TCPStore(HOST, port, is_master=False, timeout=timeout)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        result = fn(rank, world_size, *args)
        try:
            data = pickle.dumps(result)
        except Exception:
            data = cloudpickle.dumps(result)
        _write_atomic(rank_file(workdir, rank, "result"), data)
        status = 0
        # Leave only when every rank has returned, so no peer loses bytes still in flight to us.
        store.set(f"zero_ref/returned/{rank}", "1")
        store.wait([f"zero_ref/returned/{r}" for r in range(world_size)])
        dist.destroy_process_group()
    except BaseException:
        if status != 0:
            _write_atomic(rank_file(workdir, rank, "error"), traceback.format_exc().encode())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
