"""Run a DeepSpeed script on zero_ref, unedited: ``deepspeed`` and every ``deepspeed.*`` import resolve to zero_ref.ds.

    torchrun --nproc_per_node=2 -m zero_ref.ds.run train.py --deepspeed_config ds.json
    torchrun --nproc_per_node=2 -m zero_ref.ds.run -m package.module --deepspeed_config ds.json

``--local_rank_arg`` first passes ``--local_rank=LOCAL_RANK`` right after the script, as the ``deepspeed``
launcher does (``zero-ref`` uses it; a script that reads ``args.local_rank`` needs it under torchrun).
``--comm_log DIR`` records every collective each rank makes through zero_ref's comm layer and writes them at exit
to ``DIR/rank{RANK}.json`` (a list of [op, dtype, bytes, group size], in call order): the bytes an unedited script
moves, measured.

An import hook (``zero_ref.ds.alias``) is installed before the script runs, so ``import deepspeed``,
``from deepspeed import comm as dist``, ``from deepspeed.ops.adam import FusedAdam`` and the
``import deepspeed`` inside transformers and accelerate all reach zero_ref's modules: ``deepspeed.X``
*is* ``zero_ref.ds.X``. A module or name zero_ref does not have fails at import or first use, naming
it. ``zero-ref`` (zero_ref.ds.launcher.runner) starts the ranks itself, as the ``deepspeed`` launcher does.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

from zero_ref.clean_exit import run_as_main
from zero_ref.ds.alias import install

__all__ = ["main", "run", "record_collectives"]


def run(argv: list[str], local_rank_arg: bool = False) -> None:
    """Run ``argv`` (``script.py args...`` or ``-m module args...``) as ``__main__`` with the alias installed;
    with ``local_rank_arg``, ``--local_rank=LOCAL_RANK`` goes right after the script or module name."""
    install()
    if argv[0] == "-m" and len(argv) < 2:
        raise SystemExit("zero_ref.ds.run: -m needs a module name")
    if local_rank_arg:  # after the script (or the module name)
        at = 2 if argv[0] == "-m" else 1
        argv = [*argv[:at], f"--local_rank={os.environ.get('LOCAL_RANK', 0)}", *argv[at:]]
    run_as_main(argv)


def record_collectives(directory: str) -> None:
    """Record this rank's collectives from now on; write them to ``directory/rank{RANK}.json`` at exit."""
    from zero_ref import comm
    recording = comm.recording()  # left open until exit (held here: closing it would end the recording)
    log = recording.__enter__()
    path = Path(directory) / f"rank{os.environ.get('RANK', 0)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)

    def write():
        path.write_text(json.dumps([[r.op, r.dtype, r.bytes, r.group_size] for r in log.records]))
        recording.__exit__(None, None, None)

    atexit.register(write)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    local_rank_arg = comm_log = False
    while argv and argv[0] in ("--local_rank_arg", "--comm_log"):
        if argv[0] == "--local_rank_arg":
            local_rank_arg, argv = True, argv[1:]
        elif len(argv) < 2:
            raise SystemExit("zero_ref.ds.run: --comm_log needs a directory")
        else:
            comm_log, argv = argv[1], argv[2:]
    if comm_log:
        record_collectives(comm_log)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    run(argv, local_rank_arg)


if __name__ == "__main__":
    main()
