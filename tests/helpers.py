"""Helpers more than one test folder needs (the ZeRO equivalence set-up is tests/zero_ref/cases.py)."""
import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env(**extra) -> dict:
    """The environment for a torchrun job: one thread per rank, and a free master port (torchrun reads
    --master-port from PET_MASTER_PORT), so the command stays the README's and two jobs never meet on 29500."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PET_MASTER_PORT": str(free_port()), **extra}
