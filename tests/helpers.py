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


#: DeepSpeed's side of a comparison runs as ``torchrun -m zero_ref.clean_exit script ...``: with zero_ref's wait at
#: exit and nothing else of zero_ref. torch 2.13's gloo can abort a finished process at exit, a race DeepSpeed leaves
#: open (1 run in 20 measured: docs/deepspeed_differences.md, "Exit"); with the wait every run of both engines must
#: exit with status 0, and a test never passes an abort.
PEER_RUN = ["-m", "zero_ref.clean_exit"]


def torchrun_env(**extra) -> dict:
    """The environment for a torchrun job: one thread per rank, and a free master port (torchrun reads
    --master-port from PET_MASTER_PORT), so the command stays the README's and two jobs never meet on 29500."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PET_MASTER_PORT": str(free_port()), **extra}
