"""A process that has imported torch and forks ``zero_ref.launch``'s ranks on request.

A fresh Python process spends about 3 s of CPU importing torch before a rank does any work, and a
course or a test suite launches ranks hundreds of times. A fork of a process that has imported
torch but run nothing (no threads started, no CUDA initialised) starts in milliseconds with the
same modules loaded, which is what multiprocessing's "forkserver" start method does for the same
reason. Each rank is otherwise what a fresh interpreter would be: its own session (so killing its
process group kills what it started), the caller's working directory and environment at the
moment of the launch.

One server per interpreter and environment: torch reads some variables when it is imported
(``ATEN_CPU_CAPABILITY``, ``OMP_NUM_THREADS``), so a launch under a different environment starts a
new server. The server exits when its parent does (its request pipe closes) or after
``IDLE_EXIT_S`` without a request; its ranks exit when it does. ``ZERO_REF_FORK_SERVER=0`` turns it
off, and ``launch`` then starts each rank as a fresh interpreter.
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings

from zero_ref.launch_rank import run_rank

PRELOAD = ("torch", "torch.distributed", "cloudpickle", "zero_ref.launcher")
IDLE_EXIT_S = 600.0
# Variables that change while the caller runs and that no preloaded module reads (pytest sets this one per test).
_VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})

_server: _Server | None = None
_lock = threading.Lock()


def server(env: dict) -> _Server | None:
    """The running server for this environment (started if need be), or None where it is off or cannot start."""
    global _server
    if os.environ.get("ZERO_REF_FORK_SERVER", "1") == "0":
        return None
    key = (sys.executable, frozenset((k, v) for k, v in env.items() if k not in _VOLATILE))
    with _lock:
        if _server is not None and (_server.key != key or _server.proc.poll() is not None):
            _server.close()
            _server = None
        if _server is None:
            try:
                _server = _Server(key, env)
            except (OSError, RuntimeError) as e:
                warnings.warn(f"zero_ref.launch starts each rank as a fresh interpreter: {e}")
                return None
        return _server


class Rank:
    """A forked rank as ``launch`` watches it: ``pid``, and ``poll``/``wait``/``returncode`` as on a Popen."""

    def __init__(self, pid: int, status_path: str, server_proc: subprocess.Popen):
        self.pid, self.returncode = pid, None
        self._status, self._server_proc = status_path, server_proc

    def poll(self) -> int | None:
        if self.returncode is None:
            if os.path.exists(self._status):
                with open(self._status) as f:
                    self.returncode = int(f.read())
            elif self._server_proc.poll() is not None and not _alive(self.pid):
                self.returncode = 1  # its server is gone and nobody reaped it: the exit status is lost
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"rank (pid {self.pid})", timeout)
            time.sleep(0.01)
        return self.returncode


class _Server:
    def __init__(self, key, env: dict):
        self.key = key
        # Its own log, not the caller's stderr: a Jupyter kernel's fd 2 is a pipe that the kernel drains in a
        # thread, and a long-lived process holding it open can stall the kernel's output.
        self.log = tempfile.NamedTemporaryFile(prefix="zero_ref_forkserver_", suffix=".log")
        self.proc = subprocess.Popen([sys.executable, "-c", "from zero_ref.forkserver import _serve; _serve()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                     start_new_session=True)  # a Ctrl-C in the caller's terminal is the caller's
        if self.proc.stdout.readline() != b"ready\n":
            with open(self.log.name, errors="replace") as f:
                why = f.read()  # before close(), which deletes the log
            self.close()
            raise RuntimeError("the fork server did not start:\n" + why)
        self.pid = self.proc.pid
        self._requests = threading.Lock()  # one request and its reply at a time on the pipe

    def fork(self, argv: list[str], env: dict, status_path: str) -> Rank:
        request = {"argv": argv, "env": env, "cwd": os.getcwd(), "status": status_path}
        try:
            with self._requests:
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                self.proc.stdin.flush()
                pid = int(self.proc.stdout.readline())
        except (OSError, ValueError) as e:
            raise RuntimeError(f"the fork server (pid {self.pid}) stopped answering") from e
        return Rank(pid, status_path, self.proc)

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


# ------------------------------------------------------------------ server side


def _serve() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the preloaded modules print goes to stderr, never into the replies
    for name in PRELOAD:
        importlib.import_module(name)
    requests = sys.stdin.buffer
    replies.write("ready\n")
    ranks: dict[int, str] = {}  # pid -> where its exit status goes
    idle_since = time.monotonic()
    while True:
        readable, _, _ = select.select([requests], [], [], 0.05)
        _reap(ranks)
        if ranks:
            idle_since = time.monotonic()
        if readable:
            line = requests.readline()
            if not line:
                break  # the parent is gone; our ranks notice that we are and exit
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(request, replies)
            ranks[pid] = request["status"]
            replies.write(f"{pid}\n")
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_EXIT_S:
            break  # the parent sees a server that exited and starts another when it launches again


def _reap(ranks: dict[int, str]) -> None:
    while ranks:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = ranks.pop(pid, None)
        if path is not None:
            with open(path + ".tmp", "w") as f:
                f.write(str(os.waitstatus_to_exitcode(status)))
            os.replace(path + ".tmp", path)  # the parent never reads a half-written status


def _child(request: dict, replies) -> None:
    try:
        os.setsid()  # its own process group, as a fresh rank's start_new_session gives it
        signal.signal(signal.SIGINT, signal.default_int_handler)
        replies.close()  # the server's reply pipe is not the rank's
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["-c", *request["argv"]]
        run_rank()
    finally:
        os._exit(1)
