"""Chapter 27's harnesses. Task 27.3: a student's sharded save on two real ranks, once clean and once with a rank
killed (SIGKILL) half-way through its shard, and the checkpoint folder read back afterwards. Task 27.1: a student's
asynchronous save on two real ranks with slow writers, timed, and read back after its commit.

A save is ``save(rank, world, save_dir, tag, write)``: ``write(path)`` writes this rank's shard of ``tag`` to
``path``. A checkpoint is complete when its folder holds every rank's shard with the bytes ``shard_bytes`` gives.
"""
from __future__ import annotations

import hashlib
import os
import signal
import tempfile
import time

import zero_ref
from zero_ref.launcher import LaunchError

SHARD_BYTES = 1 << 16  # each rank's shard
VICTIM_DELAY_S = 1.0  # the killed rank starts writing this late: a rank that does not wait for it commits first


def shard_bytes(tag: str, rank: int) -> bytes:
    """The bytes rank ``rank`` writes for ``tag`` (different for every tag and rank)."""
    seed = hashlib.sha256(f"{tag}/{rank}".encode()).digest()
    return (seed * (SHARD_BYTES // len(seed) + 1))[:SHARD_BYTES]


def shard_name(rank: int) -> str:
    return f"shard_rank{rank:03d}.bin"


def writer(tag: str, rank: int, die: bool = False):
    """``write(path)`` for one rank; with ``die`` it writes half the shard after a delay, then SIGKILLs its process."""
    data = shard_bytes(tag, rank)

    def write(path: str) -> None:
        if die:
            time.sleep(VICTIM_DELAY_S)
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2] if die else data)
            f.flush()
            os.fsync(f.fileno())
            if die:  # what a node failure does: no exception, no clean-up
                os.kill(os.getpid(), signal.SIGKILL)

    return write


def _saves(rank: int, world: int, save, save_dir: str, tags: list[str], victim: int | None) -> None:
    for tag in tags:
        save(rank, world, save_dir, tag, writer(tag, rank, die=rank == victim and tag == tags[-1]))


def inspect(save_dir: str, world: int) -> dict:
    """What a reader of ``save_dir`` finds: ``latest`` and, for every visible (non-hidden) folder, whether it is complete."""
    latest_path = os.path.join(save_dir, "latest")
    latest = open(latest_path).read().strip() if os.path.isfile(latest_path) else None  # as load_checkpoint reads it
    folders = {}
    for name in sorted(os.listdir(save_dir)):
        path = os.path.join(save_dir, name)
        if name.startswith(".") or not os.path.isdir(path):
            continue
        shards = [os.path.join(path, shard_name(r)) for r in range(world)]
        folders[name] = all(os.path.isfile(p) and open(p, "rb").read() == shard_bytes(name, r)
                            for r, p in enumerate(shards))
    return {"latest": latest, "complete": folders}


def trial(save, root: str, world: int = 2, victim: int = 1) -> dict:
    """Saves step1 and step2 on ``world`` real ranks, then step3 with rank ``victim`` killed while writing its shard,
    into a new folder under ``root``. Returns what a reader finds after each part (``inspect``) and how the killed
    launch ended."""
    os.makedirs(root, exist_ok=True)
    save_dir = tempfile.mkdtemp(prefix="trial-", dir=root)  # every trial starts from an empty folder
    zero_ref.launch(_saves, world, save, save_dir, ["step1", "step2"], None, timeout=120, echo=False)
    clean = inspect(save_dir, world)
    try:
        zero_ref.launch(_saves, world, save, save_dir, ["step3"], victim, timeout=120, echo=False)
        ended = "every rank returned"
    except LaunchError as e:
        ended = type(e).__name__
    return {"clean": clean, "killed": inspect(save_dir, world), "killed_launch": ended}


# Task 27.1: an asynchronous save. Each rank's writer is this slow; the commit must wait for the slower one.
ASYNC_WRITE_S = (0.4, 0.8)
ASYNC_STALL_S = 0.2  # the most an asynchronous save may hold the step: half the faster write


def _latest(save_dir: str):
    path = os.path.join(save_dir, "latest")
    return open(path).read().strip() if os.path.isfile(path) else None


def _async_inspect(save_dir: str, world: int, tag: str) -> dict:
    """``latest``, and the first weight in every rank's shard of ``tag`` (None where a shard is missing or torn)."""
    import torch

    values = []
    for r in range(world):
        try:
            values.append(float(torch.load(os.path.join(save_dir, tag, shard_name(r)), weights_only=True)["w"][0]))
        except Exception:
            values.append(None)
    return {"latest": _latest(save_dir), "weights": values}


def _async_saves(rank: int, world: int, async_save, save_dir: str) -> list[dict]:
    import torch

    state = {"w": torch.full((4096,), float(rank))}  # this rank's shard of the weights

    def write(path, snapshot):
        time.sleep(ASYNC_WRITE_S[rank])  # a slow file system
        torch.save(snapshot, path)

    out = []
    for tag in ("step1", "step2"):
        start = time.perf_counter()
        commit = async_save(rank, world, save_dir, tag, state, write)
        stall = time.perf_counter() - start
        saved = float(state["w"][0])
        with torch.no_grad():
            state["w"].add_(1.0)  # the next optimizer step updates the weights in place
        during = _latest(save_dir)  # while the writers still run
        commit()
        out.append(dict(tag=tag, stall=stall, saved=saved, during=during,
                        after=_async_inspect(save_dir, world, tag) if rank == 0 else None))
    return out


def async_trial(async_save, root: str, world: int = 2) -> list[list[dict]]:
    """Task 27.1's check: ``async_save`` saves step1 and step2 on ``world`` real ranks into a new folder under
    ``root``. Per rank and save: how long the call held the step, the weight at the save, ``latest`` before
    ``commit()``, and (rank 0) ``latest`` and every shard's first weight once ``commit()`` returned."""
    os.makedirs(root, exist_ok=True)
    save_dir = tempfile.mkdtemp(prefix="async-", dir=root)
    return zero_ref.launch(_async_saves, world, async_save, save_dir, timeout=120, echo=False)
