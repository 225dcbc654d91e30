"""A clean exit after gloo collectives: at interpreter exit, wait until torch's gloo workers are idle.

Why a process that finished its work can still die with "terminate called without an active
exception" (SIGABRT): a gloo process group runs each collective on a worker thread of its own
(``ProcessGroupGloo::runLoop``, named ``pt_gloo_runloop``). The caller's ``wait()`` returns as soon as
the work is done; the worker drops its reference to the work only afterwards, and that drop reaches
Python objects (a tensor Python shares, the context torch's backward keeps in thread-local state), so
it takes the GIL. If the main thread has entered interpreter finalization by then, ``take_gil`` ends
the worker with ``pthread_exit``, whose unwinding through a ``noexcept`` destructor calls
``std::terminate``. A script whose last collective comes just before its exit (a pipeline's loss
broadcast, ``loss.item()``, a print, the end) loses that race often.

``drain`` runs at exit (``atexit``, registered when ``zero_ref.comm`` is imported), while the
interpreter is still whole: it releases the GIL until every gloo worker is idle, blocked with no
timeout on its queue (read from ``/proc/self/task/*/syscall``; Linux), for at most ``timeout``
seconds. It destroys no group (a script's own ``destroy_process_group`` still works, before or after)
and does nothing in a process without gloo workers.

Any script can have the wait, DeepSpeed's included (the tests run DeepSpeed's side of a comparison so):

    torchrun --nproc_per_node=2 -m zero_ref.clean_exit train.py ARGS      (or: -m zero_ref.clean_exit -m package.module)
"""
from __future__ import annotations

import atexit
import os
import platform
import runpy
import sys
import time

__all__ = ["drain", "gloo_workers", "busy_workers", "run_as_main"]

_TASKS = "/proc/self/task"
_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())


def gloo_workers() -> list[str]:
    """Thread ids of this process's gloo worker threads (empty where /proc is not readable)."""
    out = []
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/comm") as f:
                if f.read().strip() == "pt_gloo_runloop":
                    out.append(tid)
        except OSError:  # the thread ended
            pass
    return out


def _idle(tid: str) -> bool:
    """Blocked in futex with no timeout: waiting for work (a thread that waits for the GIL does so with one)."""
    try:
        with open(f"{_TASKS}/{tid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return True  # the thread ended
    return len(fields) > 4 and fields[0] == str(_FUTEX) and int(fields[4], 16) == 0


def busy_workers() -> list[str]:
    """The gloo workers that are not idle now."""
    return [t for t in gloo_workers() if not _idle(t)]


def drain(timeout: float = 3.0, poll: float = 0.002) -> bool:
    """Release the GIL until every gloo worker was seen idle twice in a row; False if ``timeout`` passed
    first (a collective still in flight: a peer that never answered)."""
    if _FUTEX is None or not gloo_workers():
        return True
    end, calm = time.monotonic() + timeout, 0
    while time.monotonic() < end:
        time.sleep(poll)  # the GIL is free: a worker waiting for it finishes its clean-up
        calm = calm + 1 if not busy_workers() else 0
        if calm == 2:
            return True
    return False


def run_as_main(argv: list[str]) -> None:
    """Run ``script.py args...`` or ``-m module args...`` as ``__main__``, as ``python`` would."""
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("-m needs a module name")
        sys.argv = argv[1:]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        if not os.path.isfile(argv[0]):
            raise SystemExit(f"no script {argv[0]!r}")
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


atexit.register(drain)

if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m zero_ref.clean_exit script.py ARGS | -m module ARGS")
    run_as_main(sys.argv[1:])
