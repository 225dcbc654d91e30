"""Chapter 27's fault-injection harness for Task 27.3: a student's sharded save on two real ranks, once clean and
once with a rank killed (SIGKILL) half-way through its shard, and the checkpoint folder read back afterwards.

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
