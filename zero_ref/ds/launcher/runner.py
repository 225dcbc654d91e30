"""``zero-ref`` (``deepspeed.launcher.runner``): the ``deepspeed`` launcher's counterpart on one machine.

    zero-ref --num_gpus 2 train.py --deepspeed --deepspeed_config ds.json
    zero-ref --include localhost:0,1 --master_port 29501 --module pkg.train --epochs 1

takes DeepSpeed 0.19.8's launcher arguments (``deepspeed/launcher/runner.py``, ``parse_args``), starts one
process per rank through torchrun's machinery (``torch.distributed.run``) with ``deepspeed`` resolved to
zero_ref.ds in each (``zero_ref.ds.run``), and, as DeepSpeed's ``launcher/launch.py`` does, passes
``--local_rank=N`` right after the script unless ``--no_local_rank``, and sets RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_SIZE, MASTER_ADDR and MASTER_PORT.

How many ranks: as DeepSpeed's launcher counts them. Its resource pool is one slot per GPU, and on a
machine without one (``cpu_accelerator.device_count``) ``LOCAL_SIZE`` or else one slot per NUMA node
(usually 1); ``--num_gpus N`` (``--num_accelerators N``) asks for N ranks whatever the pool, and
``--include`` / ``--exclude localhost:SLOTS`` pick slots of the pool. So on a CPU machine give
``--num_gpus N``. Several nodes (``--hostfile``, ``--num_nodes`` > 1, another host in ``--include``,
``--node_rank``, ``--force_multi``, a multi-node ``--launcher``), ``--no_python``, ``--autotuning``,
core binding and per-rank logs are refused, each naming its argument.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

__all__ = ["main", "parse_args", "resources", "rank_command"]

DEFAULT_PORT = 29500  # deepspeed/constants.py, TORCH_DISTRIBUTED_DEFAULT_PORT
LOCAL_HOSTS = {"localhost", "127.0.0.1", socket.gethostname()}


class LaunchError(ValueError):
    """An argument zero-ref cannot honour on one machine."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="zero-ref", description="Run a DeepSpeed script on zero_ref (one node); "
                                "takes DeepSpeed's launcher arguments.")
    p.add_argument("-H", "--hostfile", default=None, help="refused: zero-ref runs on this machine only")
    p.add_argument("-i", "--include", default="", help="slots of this machine: localhost:0,1")
    p.add_argument("-e", "--exclude", default="", help="slots of this machine to leave out: localhost:1")
    p.add_argument("--num_nodes", type=int, default=-1, help="1 (or unset): one machine")
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1,
                   help="ranks to start (on a CPU machine, the way to ask for more than one)")
    p.add_argument("--master_port", type=int, default=DEFAULT_PORT)
    p.add_argument("--master_addr", default="", help="this machine's address (DeepSpeed uses 127.0.0.1 on one node)")
    p.add_argument("--node_rank", type=int, default=-1)
    p.add_argument("--launcher", default="pdsh", help="a multi-node backend; unused on one node")
    p.add_argument("--launcher_args", default="")
    p.add_argument("--module", action="store_true", help="user_script is a module name (python -m)")
    p.add_argument("--no_python", action="store_true")
    p.add_argument("--no_local_rank", action="store_true", help="do not pass --local_rank=N to the script")
    p.add_argument("--no_ssh", action="store_true")
    p.add_argument("--no_ssh_check", action="store_true")
    p.add_argument("--force_multi", action="store_true")
    p.add_argument("--save_pid", action="store_true")
    p.add_argument("--enable_each_rank_log", default="None")
    p.add_argument("--autotuning", default="")
    p.add_argument("--bind_cores_to_rank", action="store_true")
    p.add_argument("--bind_core_list", default=None)
    p.add_argument("--ssh_port", type=int, default=None)
    p.add_argument("--venv_script", default=None)
    p.add_argument("--log_level", default="info")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("user_script")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


def refuse_multi_node(a: argparse.Namespace) -> None:
    """Raise ``LaunchError`` naming the first argument that needs more than this machine, or that zero-ref
    cannot honour."""
    why = "zero-ref starts ranks on this machine only (DeepSpeed's launcher reaches other nodes over ssh)"
    checks = [
        (a.hostfile is not None, f"--hostfile {a.hostfile}", why),
        (a.num_nodes > 1, f"--num_nodes {a.num_nodes}", why + "; use --num_nodes 1"),
        (a.node_rank > 0, f"--node_rank {a.node_rank}", why),
        (a.force_multi, "--force_multi", why),
        (a.launcher.lower() != "pdsh", f"--launcher {a.launcher}", why + "; leave --launcher out"),
        (bool(a.launcher_args), "--launcher_args", why),
        (a.no_python, "--no_python", "zero-ref runs a Python script or module (the alias lives in the interpreter)"),
        (bool(a.autotuning), f"--autotuning {a.autotuning}", "DeepSpeed's autotuner is not part of zero_ref"),
        (a.bind_cores_to_rank or a.bind_core_list is not None, "--bind_cores_to_rank/--bind_core_list",
         "zero-ref does not bind cores (set OMP_NUM_THREADS per rank instead)"),
        (a.enable_each_rank_log != "None", "--enable_each_rank_log", "every rank writes to this terminal"),
        (a.save_pid, "--save_pid", "zero-ref writes no pid file"),
    ]
    for bad, arg, reason in checks:
        if bad:
            raise LaunchError(f"zero-ref: {arg} is not supported: {reason}")
    if a.master_addr and a.master_addr not in LOCAL_HOSTS:
        raise LaunchError(f"zero-ref: --master_addr {a.master_addr} is another machine; {why}")


def pool_size() -> int:
    """DeepSpeed's resource pool on this machine: its GPUs; without one, LOCAL_SIZE or the NUMA nodes that
    have cores (``cpu_accelerator.device_count``)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    if int(os.environ.get("LOCAL_SIZE", 0)) > 0:
        return int(os.environ["LOCAL_SIZE"])
    nodes = "/sys/devices/system/node"
    try:
        cpulists = {open(f"{nodes}/{n}/cpulist").read().strip() for n in os.listdir(nodes) if n.startswith("node")}
    except OSError:
        return 1
    return max(1, len({c for c in cpulists if c}))


def _slots(spec: str, arg: str, pool: int) -> list[int]:
    """The slots ``localhost:0,1`` names (all of the pool for a bare host name)."""
    if "@" in spec:
        raise LaunchError(f"zero-ref: {arg} {spec} names several hosts; zero-ref runs on this machine only")
    host, _, slots = spec.partition(":")
    if host not in LOCAL_HOSTS:
        raise LaunchError(f"zero-ref: {arg} {spec}: host {host!r} is not this machine (use localhost)")
    if not slots:
        return list(range(pool))
    out = [int(s) for s in slots.split(",")]
    for s in out:
        if not 0 <= s < pool:
            raise LaunchError(f"zero-ref: {arg} {spec}: no slot {s} on this machine (its pool has {pool}: "
                              f"{'GPUs' if _cuda() else 'LOCAL_SIZE or NUMA nodes'}); ask for N ranks with --num_gpus N")
    return out


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def resources(a: argparse.Namespace, pool: int | None = None) -> list[int]:
    """The slots (local ranks' devices) to run on, as DeepSpeed's ``parse_inclusion_exclusion`` and
    ``apply_num_nodes_and_gpus`` choose them on one node."""
    refuse_multi_node(a)
    if (a.num_nodes >= 0 or a.num_gpus >= 0) and (a.include or a.exclude):
        raise LaunchError("zero-ref: --num_nodes/--num_gpus cannot be combined with --include/--exclude "
                          "(DeepSpeed refuses it too)")
    pool = pool_size() if pool is None else pool
    if a.include and a.exclude:
        raise LaunchError("zero-ref: --include and --exclude are mutually exclusive (as in DeepSpeed)")
    if a.include:
        slots = _slots(a.include, "--include", pool)
    elif a.exclude:
        dropped = set(_slots(a.exclude, "--exclude", pool))
        slots = [s for s in range(pool) if s not in dropped]
    else:
        slots = list(range(pool))
    if a.num_gpus > 0:
        slots = list(range(a.num_gpus))
    if not slots:
        raise LaunchError("zero-ref: no ranks left to run (check --include/--exclude/--num_gpus)")
    return slots


def rank_command(a: argparse.Namespace) -> list[str]:
    """What torchrun runs in each rank: ``-m zero_ref.ds.run [--local_rank_arg] [-m] script args``."""
    cmd = ["-m", "zero_ref.ds.run"]
    if not a.no_local_rank:
        cmd.append("--local_rank_arg")
    if a.module:
        cmd.append("-m")
    return cmd + [a.user_script, *a.user_args]


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    try:
        slots = resources(a)
    except LaunchError as e:
        raise SystemExit(str(e)) from None
    from torch.distributed import run as torchrun

    os.environ.update(LOCAL_SIZE=str(len(slots)), CROSS_RANK="0", CROSS_SIZE="1")
    if _cuda():  # as DeepSpeed's launch: the chosen GPUs, seen by each rank as 0..n-1
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # kept: slots index the GPUs it shows
        ids = visible.split(",") if visible else [str(s) for s in range(max(slots) + 1)]
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[s] for s in slots)
    args = ["--nnodes=1", f"--nproc_per_node={len(slots)}", "--master_addr=127.0.0.1",
            f"--master_port={a.master_port}", *rank_command(a)]
    if not a.quiet:
        print(f"[zero-ref] {len(slots)} rank(s) on this machine, deepspeed = zero_ref.ds: {a.user_script}",
              file=sys.stderr)
    torchrun.main(args)


if __name__ == "__main__":
    main()
