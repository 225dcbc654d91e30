"""The NVMe tier of ZeRO-Infinity: tensors in files, read and written on worker threads.

DeepSpeed swaps optimizer states (and ZeRO-3 parameter partitions) between pinned host buffers
and files on an NVMe drive with its ``aio`` C++ library (libaio / io_uring). This module does the
same job in Python, small enough to read:

- ``AsyncFileIO`` reads and writes a tensor's bytes with ``os.preadv`` / ``os.pwrite`` on a pool
  of worker threads (the system calls release the GIL, so the main thread keeps computing). Each
  operation is cut into ``block_size`` blocks spread over ``intra_op_parallelism`` threads, and at
  most ``queue_depth`` operations are in flight. Every operation records a ``SwapEvent`` with its
  start and end time: the timeline of chapter 7 is drawn from this log.
- ``VersionedStore`` keeps named tensors as files under one directory and makes each step's
  writes visible **atomically**: a step writes new files (``<key>.v<version>``), and only when
  every one is complete does a one-line manifest (``CURRENT``, JSON ``{key: version}``) replace
  the old one with ``os.replace`` (an atomic rename). Old files are deleted after that. A write
  that fails (disk full, a file-size limit, an I/O error) therefore leaves the previous manifest
  and the previous files in place: the next read sees the last consistent state. The price is
  disk space for two versions during a step, which ``check_nvme_path`` checks up front.
- ``check_nvme_path`` refuses a missing, unwritable or too small ``nvme_path`` with a clear
  error *before* training starts.
- ``SubGroupSwapper`` runs the optimizer step of ZeRO-Infinity over sub-groups: read sub-group i
  (prefetched while i−1 steps, with ``pipeline_read``), step it, write it back (in the
  background while i+1 steps, with ``pipeline_write``), using at most ``buffer_count`` host
  buffers (one per state tensor of a sub-group), then commit the new version.

Simplified vs DeepSpeed: Python threads instead of libaio/io_uring, no O_DIRECT (buffered I/O, so
the page cache may serve reads; DeepSpeed bypasses it), ``single_submit`` and ``overlap_events``
are accepted but change nothing, no GPUDirect Storage (``use_gds``), no ``fsync`` (atomic against
failed writes and crashes of the process, not against power loss). DeepSpeed overwrites its swap
files in place; the versioned store is our addition.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SwapEvent:
    """One read, write or optimizer step on the NVMe tier, timed on this rank's clock (seconds)."""

    kind: str       # "read" | "write" | "step" | "wait"
    key: str        # file key ("optim3", "param12") or sub-group label
    start: float
    end: float
    nbytes: int = 0
    thread: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start


class SwapError(RuntimeError):
    """A read or write on the NVMe tier failed; the store still holds its previous version."""


class EventLog:
    """A thread-safe list of ``SwapEvent`` with one time origin."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.events: list[SwapEvent] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def add(self, kind: str, key: str, start: float, end: float, nbytes: int = 0) -> None:
        ev = SwapEvent(kind, key, start, end, nbytes, threading.current_thread().name)
        with self._lock:
            self.events.append(ev)

    def clear(self) -> None:
        with self._lock:
            self.events.clear()

    def bytes(self, kind: str) -> int:
        return sum(e.nbytes for e in self.events if e.kind == kind)


def _byte_view(t: torch.Tensor) -> memoryview:
    """The tensor's bytes as a writable memoryview (any dtype, bf16 included; CPU, contiguous)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"swap buffers must be contiguous CPU tensors, got {t.device} contiguous={t.is_contiguous()}")
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


class AsyncFileIO:
    """Asynchronous whole-tensor reads and writes on worker threads (DeepSpeed's ``aio`` handle)."""

    def __init__(self, block_size: int = 1048576, queue_depth: int = 8, intra_op_parallelism: int = 1,
                 single_submit: bool = False, overlap_events: bool = True, log: EventLog | None = None):
        self.block_size, self.queue_depth, self.threads = block_size, queue_depth, intra_op_parallelism
        self.single_submit, self.overlap_events = single_submit, overlap_events
        self.log = log or EventLog()
        # One thread per operation in flight, plus the helpers each operation splits its blocks over.
        self._ops = ThreadPoolExecutor(max_workers=queue_depth, thread_name_prefix="aio-op")
        self._blocks = ThreadPoolExecutor(max_workers=intra_op_parallelism, thread_name_prefix="aio-block") \
            if intra_op_parallelism > 1 else None

    def close(self) -> None:
        self._ops.shutdown(wait=True)
        if self._blocks is not None:
            self._blocks.shutdown(wait=True)

    def _ranges(self, nbytes: int) -> list[list[tuple[int, int]]]:
        """Blocks of ``block_size`` bytes, dealt round-robin to ``intra_op_parallelism`` threads."""
        blocks = [(s, min(nbytes, s + self.block_size)) for s in range(0, nbytes, self.block_size)]
        return [blocks[i::self.threads] for i in range(self.threads)]

    def _run(self, fn, nbytes: int) -> None:
        parts = [p for p in self._ranges(nbytes) if p]
        if self._blocks is None or len(parts) <= 1:
            for p in parts:
                fn(p)
        else:
            for f in [self._blocks.submit(fn, p) for p in parts]:
                f.result()

    def write(self, path: str, t: torch.Tensor, key: str = "") -> Future:
        """Write ``t``'s bytes to a new file ``path`` (created, truncated); the future raises on failure."""
        buf = _byte_view(t)

        def job():
            start = self.log.now()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                def blocks(ranges):
                    for a, b in ranges:
                        done = a
                        while done < b:  # pwrite may write less than asked
                            done += os.pwrite(fd, buf[done:b], done)
                self._run(blocks, len(buf))
            finally:
                os.close(fd)
            self.log.add("write", key, start, self.log.now(), len(buf))

        return self._ops.submit(job)

    def read(self, path: str, t: torch.Tensor, key: str = "") -> Future:
        """Read ``path`` into ``t`` (its size must be exactly ``t``'s bytes)."""
        buf = _byte_view(t)

        def job():
            start = self.log.now()
            size = os.path.getsize(path)
            if size != len(buf):
                raise SwapError(f"{path} holds {size} bytes but the tensor needs {len(buf)}")
            fd = os.open(path, os.O_RDONLY)
            try:
                def blocks(ranges):
                    for a, b in ranges:
                        done = a
                        while done < b:
                            n = os.preadv(fd, [buf[done:b]], done)
                            if n == 0:
                                raise SwapError(f"{path}: unexpected end of file at byte {done}")
                            done += n
                self._run(blocks, len(buf))
            finally:
                os.close(fd)
            self.log.add("read", key, start, self.log.now(), len(buf))

        return self._ops.submit(job)


def check_nvme_path(path, bytes_needed: int, key: str = "offload_optimizer.nvme_path") -> str:
    """The absolute path, after checking it exists, is a writable directory and has ``bytes_needed`` free.

    Raises ``ValueError`` naming ``key`` otherwise (before any training step writes there)."""
    if path is None or str(path) == "":
        raise ValueError(f"zero_optimization.{key} is required when the device is 'nvme'")
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise ValueError(f"zero_optimization.{key}={path!r} does not exist: create the directory (on the NVMe "
                         "drive) first")
    if not os.path.isdir(path):
        raise ValueError(f"zero_optimization.{key}={path!r} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".zero_ref_probe_") as f:
            f.write(b"x")
            f.flush()
    except OSError as e:
        raise ValueError(f"zero_optimization.{key}={path!r} is not writable: {e.strerror or e}") from None
    free = shutil.disk_usage(path).free
    if free < bytes_needed:
        raise ValueError(f"zero_optimization.{key}={path!r} has {free:,} bytes free but the swap files need "
                         f"{bytes_needed:,} (two versions of every swapped tensor, for every rank on this path): "
                         "free space or point nvme_path at a larger drive")
    return path


class VersionedStore:
    """Named tensors in files; each step's writes become visible together, or not at all.

    ``begin()`` opens a new version; ``write(key, t)`` writes ``<key>.v<version>`` (asynchronously);
    ``commit()`` waits for the writes and atomically replaces the manifest; ``abort()`` deletes the
    new files. ``read(key, out)`` always reads the last committed version."""

    MANIFEST = "CURRENT"

    def __init__(self, root: str, io: AsyncFileIO, prefix: str = "zero_ref_"):
        self.dir = tempfile.mkdtemp(prefix=prefix, dir=root)
        self.io, self.log = io, io.log
        self.current: dict[str, int] = {}  # key -> committed version
        self.version = 0
        self._pending: dict[str, tuple[int, Future]] = {}
        self.is_open = False  # between begin() and commit() / abort()
        self.fail_after: int | None = None  # testing: raise ENOSPC on the n-th next write (None: never)

    def _path(self, key: str, version: int) -> str:
        return os.path.join(self.dir, f"{key}.v{version}")

    # ------------------------------------------------------------ writing a version
    def begin(self) -> int:
        if self.is_open:
            raise SwapError("a version is already open: commit() or abort() it first")
        self.version += 1
        self.is_open = True
        return self.version

    def write(self, key: str, t: torch.Tensor) -> Future:
        if not self.is_open or key in self._pending:
            raise SwapError(f"write({key!r}) outside begin()/commit() or twice in one version")
        if self.fail_after is not None:
            self.fail_after -= 1
            if self.fail_after < 0:
                self.fail_after = None
                fut: Future = Future()
                fut.set_exception(OSError(errno.ENOSPC, "No space left on device (injected)", self._path(key, self.version)))
                self._pending[key] = (self.version, fut)
                return fut
        fut = self.io.write(self._path(key, self.version), t, key)
        self._pending[key] = (self.version, fut)
        return fut

    def wait_writes(self) -> None:
        """Wait for this version's writes; on the first failure abort the version and raise ``SwapError``."""
        error = None
        for key, (_, fut) in self._pending.items():
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001 - any failure means the version is incomplete
                error = error or (key, e)
        if error:
            self.abort()
            key, e = error
            raise SwapError(f"writing {key!r} to {self.dir} failed ({e}); the swap files still hold the "
                            f"previous version") from e

    def commit(self) -> None:
        self.wait_writes()
        new = dict(self.current)
        new.update((key, v) for key, (v, _) in self._pending.items())
        tmp = os.path.join(self.dir, self.MANIFEST + ".tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(new, f)
            os.replace(tmp, os.path.join(self.dir, self.MANIFEST))  # the atomic step
        except OSError as e:
            self.abort()
            raise SwapError(f"committing version {self.version} in {self.dir} failed ({e}); the swap files "
                            "still hold the previous version") from e
        old, self.current = self.current, new
        self._pending.clear()
        self.is_open = False
        for key, v in old.items():
            if new[key] != v:
                _unlink(self._path(key, v))

    def abort(self) -> None:
        for key, (v, fut) in self._pending.items():
            try:
                fut.result()
            except Exception:  # noqa: BLE001
                pass
            _unlink(self._path(key, v))
        self._pending.clear()
        self.is_open = False

    # ------------------------------------------------------------ reading
    def read(self, key: str, out: torch.Tensor) -> Future:
        if key not in self.current:
            raise SwapError(f"{key!r} has no committed version in {self.dir}")
        return self.io.read(self._path(key, self.current[key]), out, key)

    def load_manifest(self) -> dict[str, int]:
        """The manifest on disk (what a restarted process would read)."""
        with open(os.path.join(self.dir, self.MANIFEST)) as f:
            return json.load(f)

    def file_bytes(self, prefix: str = "") -> int:
        """Bytes on disk of the committed files whose key starts with ``prefix``."""
        return sum(os.path.getsize(self._path(k, v)) for k, v in self.current.items() if k.startswith(prefix))

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def sub_group_plan(numels: list[int], sub_group_size: int) -> list[list[int]]:
    """Indices of the partitions in each sub-group, as DeepSpeed's stage 3 forms them
    (``_create_fp16_sub_groups``): walk the partitions in order, close a sub-group once it holds
    ``sub_group_size`` elements or more. One sub-group if everything fits.

    >>> sub_group_plan([4, 4, 4, 10, 1], 8)
    [[0, 1], [2, 3], [4]]
    """
    if sub_group_size < 1:
        raise ValueError(f"sub_group_size must be >= 1, got {sub_group_size}")
    if not numels or sub_group_size >= sum(numels):
        return [list(range(len(numels)))]
    plan, current, size = [], [], 0
    for i, n in enumerate(numels):
        current.append(i)
        size += n
        if size >= sub_group_size or i == len(numels) - 1:
            plan.append(current)
            current, size = [], 0
    return plan


def swap_timeline(read_s, step_s, write_s, *, buffer_count: int = 4, n_states: int = 3, pipeline_read: bool = False,
                  pipeline_write: bool = False) -> list[tuple[str, int, float, float]]:
    """The timeline ``SubGroupSwapper.run`` produces when sub-group i takes ``read_s[i]`` seconds to read,
    ``step_s[i]`` to step and ``write_s[i]`` to write: (kind, i, start, end) in the order it issues them.

    The model: one CPU thread runs the steps and issues the I/O in the swapper's program order (the same
    buffer rules); one NVMe queue serves reads and writes one at a time, first come first served, so
    they share its bandwidth. Prefetch hides sub-group i+1's read behind step i when the read is issued
    first and the queue is free; a write issued before a read delays it.

    >>> [(k, i, s, e) for k, i, s, e in swap_timeline([2, 2], [3, 3], [1, 1], buffer_count=6,
    ...                                               pipeline_read=True, pipeline_write=True)]
    [('read', 0, 0, 2), ('read', 1, 2, 4), ('step', 0, 2, 5), ('write', 0, 5, 6), ('step', 1, 5, 8), ('write', 1, 8, 9)]
    """
    n = len(read_s)
    if not (len(step_s) == len(write_s) == n):
        raise ValueError(f"read_s, step_s and write_s must have one entry per sub-group, got {n}, {len(step_s)}, "
                         f"{len(write_s)}")
    slots = buffer_count // n_states
    if slots < 1 or ((pipeline_read or pipeline_write) and slots < 2):
        raise ValueError(f"buffer_count={buffer_count} holds {slots} sub-group(s) of {n_states} buffers; one is "
                         f"needed, two to pipeline")
    free, cpu, disk = min(slots, n), 0, 0
    events: list[tuple[str, int, float, float]] = []
    read_end: dict[int, float] = {}
    writes: list[tuple[int, float]] = []

    def io(kind: str, i: int, duration: float) -> float:
        nonlocal disk
        start = max(cpu, disk)  # issued now, served after everything issued before
        disk = start + duration
        events.append((kind, i, start, disk))
        return disk

    def start_read(i: int) -> None:
        nonlocal free, cpu
        while free == 0:  # wait for the oldest write to free its buffer
            _, end = writes.pop(0)
            cpu = max(cpu, end)
            free += 1
        free -= 1
        read_end[i] = io("read", i, read_s[i])

    for i in range(n):
        if i not in read_end:
            start_read(i)
        cpu = max(cpu, read_end.pop(i))
        if pipeline_read and i + 1 < n and (free or writes):
            start_read(i + 1)
        events.append(("step", i, cpu, cpu + step_s[i]))
        cpu += step_s[i]
        end = io("write", i, write_s[i])
        if pipeline_write:
            writes.append((i, end))
        else:
            cpu = max(cpu, end)
            free += 1
    return events


class SubGroupSwapper:
    """ZeRO-Infinity's optimizer step: sub-groups of flat fp32 states, swapped through a few host buffers.

    Sub-group i's states (``n_states`` tensors of ``numel[i]`` elements: master, exp_avg, exp_avg_sq)
    live in one file ``optim<i>``. ``run(step_fn)`` reads each sub-group into a host buffer, calls
    ``step_fn(i, states)`` and writes the buffer back, with at most ``buffer_count // n_states``
    sub-groups resident. ``pipeline_read`` starts reading sub-group i+1 before i steps;
    ``pipeline_write`` lets the write of i finish while i+1 steps. Either needs room for two
    sub-groups (``buffer_count >= 2 * n_states``), as DeepSpeed's pipelined swapper does."""

    def __init__(self, store: VersionedStore, numels: list[int], n_states: int = 3, buffer_count: int = 4,
                 pipeline_read: bool = False, pipeline_write: bool = False, pin_memory: bool = False):
        if buffer_count < n_states:
            raise ValueError(f"zero_optimization.offload_optimizer.buffer_count={buffer_count} is too small: one "
                             f"sub-group needs {n_states} buffers (fp32 master, exp_avg, exp_avg_sq)")
        self.slots = buffer_count // n_states
        if (pipeline_read or pipeline_write) and self.slots < 2:
            raise ValueError(f"zero_optimization.offload_optimizer.buffer_count={buffer_count} holds one sub-group "
                             f"({n_states} buffers each); pipeline_read / pipeline_write overlap two, so they need "
                             f"buffer_count >= {2 * n_states}")
        self.store, self.log, self.numels, self.n_states = store, store.log, list(numels), n_states
        self.pipeline_read, self.pipeline_write = pipeline_read, pipeline_write
        width = n_states * max(numels)
        self._free = [torch.zeros(width, dtype=torch.float32, pin_memory=pin_memory)
                      for _ in range(min(self.slots, len(numels)))]
        self.buffers = list(self._free)  # every host buffer (for memory accounting)
        self.schedule: list[tuple[str, int]] = []  # program order of the last run: ("read", i), ("step", i), ...

    @staticmethod
    def key(i: int) -> str:
        return f"optim{i}"

    def _views(self, buf: torch.Tensor, i: int) -> list[torch.Tensor]:
        n = self.numels[i]
        return [buf[k * n:(k + 1) * n] for k in range(self.n_states)]

    def write_initial(self, i: int, states: list[torch.Tensor]) -> None:
        """Write sub-group i's first version (inside an open store version)."""
        flat = torch.cat([s.reshape(-1).float() for s in states])
        self.store.write(self.key(i), flat)

    def run(self, step_fn, order: list[int] | None = None) -> None:
        """Step every sub-group (in ``order``) and write it back, inside an open store version."""
        order = list(range(len(self.numels))) if order is None else order
        self.schedule = []
        reads: dict[int, tuple[Future, torch.Tensor]] = {}
        writes: list[tuple[int, Future, torch.Tensor]] = []

        def take_buffer() -> torch.Tensor:
            while not self._free:  # every buffer is being written back: wait for the oldest write
                j, fut, buf = writes.pop(0)
                self.schedule.append(("wait-write", j))
                try:
                    self._wait(fut, f"wait-write{j}")
                finally:
                    self._free.append(buf)
            return self._free.pop()

        def start_read(i: int) -> None:
            buf = take_buffer()
            n = self.n_states * self.numels[i]
            reads[i] = (self.store.read(self.key(i), buf[:n]), buf)
            self.schedule.append(("read", i))

        try:
            for pos, i in enumerate(order):
                if i not in reads:
                    start_read(i)
                fut, buf = reads.pop(i)
                self._wait(fut, f"wait-read{i}")
                nxt = order[pos + 1] if pos + 1 < len(order) else None
                if self.pipeline_read and nxt is not None and (self._free or writes):
                    start_read(nxt)  # prefetch: read i+1 while i steps
                start = self.log.now()
                self.schedule.append(("step", i))
                step_fn(i, self._views(buf, i))
                self.log.add("step", f"sub-group {i}", start, self.log.now(), 4 * self.numels[i])
                fut = self.store.write(self.key(i), buf[:self.n_states * self.numels[i]])
                self.schedule.append(("write", i))
                if self.pipeline_write:
                    writes.append((i, fut, buf))
                else:
                    self._wait(fut, f"wait-write{i}")
                    self._free.append(buf)
        finally:  # (after a failure too) nothing may still be writing into a buffer we hand out again
            for fut, _ in list(reads.values()) + [(f, b) for _, f, b in writes]:
                try:
                    fut.result()
                except Exception:  # noqa: BLE001 - reported by the store's wait_writes
                    pass
            self._free = list(self.buffers)

    def _wait(self, fut: Future, what: str) -> None:
        start = self.log.now()
        try:
            fut.result()
        except SwapError:
            raise
        except Exception as e:  # noqa: BLE001
            verb, i = ("writing", what[len("wait-write"):]) if what.startswith("wait-write") else \
                ("reading", what[len("wait-read"):])
            raise SwapError(f"{verb} sub-group {i} in {self.store.dir} failed ({e}); the swap files still hold "
                            "the previous version") from e
        end = self.log.now()
        if end - start > 1e-4:
            self.log.add("wait", what, start, end)
