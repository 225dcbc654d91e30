"""``python -m sim plan``: the plans that fit a model on a cluster, ranked, and the chosen one as a DeepSpeed config.

    python -m sim plan --model llama-3-8b --gpus 64 --gpu H100-80GB --seq 8192 --global-batch 512 \
        --write-config ds_config.json

The model is a preset (``sim.MODELS``) or the path of a HuggingFace config.json (or its folder).
The search (sim.planning.search) runs on the calibrated cost model (sim.calibration.calibrate.calibrate()), with
FlashAttention (``--attention``, as today's runs use it) and DeepSpeed 0.19.8's collectives and
constraints (``--framework``: 'deepspeed', 'megatron' for Megatron-Core's distributed optimizer,
'fsdp2' for torch's fully_shard, 'any' for DeepSpeed's collectives without its constraints). For the best few plans that fit it prints the step time, MFU
and the peak GPU memory of the first pipeline stage by category, and the host memory the
offloaded states take. ``--write-config`` writes the first plan as a DeepSpeed config (what
zero_ref.config.parse and DeepSpeed read; a DeepSpeed plan only); tp, pp, recomputation, sequence parallelism, the
attention kernel and context parallelism (cp: DeepSpeed-Ulysses, or ring attention with ``--framework any``)
are not DeepSpeed config keys, so they are printed for the launcher and model code.
Impossible requests (a model too big for the cluster, a batch that does not divide) end with a
one-line error and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.calibration.calibrate import calibrate
from sim.planning import advice, search
from sim.spec.hardware import GPUS
from sim.spec.model import MODELS, Model
from sim.step.simulate import simulate

GiB = 2**30
TOKENS_PER_BATCH = 4 * 2**20  # the default global batch: about 4 Mi tokens, as the Llama papers train


class PlanError(ValueError):
    """An impossible request: the message says which input and why."""


def load_model(name: str, seq: int | None) -> Model:
    if name.lower() in MODELS:
        return Model.preset(name, **({"seq": seq} if seq else {}))
    if Path(name).exists():
        return Model.from_hf_config(name, seq=seq, name=Path(name).stem if Path(name).is_file() else Path(name).name)
    raise PlanError(f"--model {name!r} is neither a preset ({', '.join(MODELS)}) nor a HF config path")


def default_global_batch(model: Model, gpus: int) -> int:
    """About TOKENS_PER_BATCH tokens, rounded to a multiple of the GPU count (so every dp divides it)."""
    return max(1, round(TOKENS_PER_BATCH / model.seq / gpus)) * gpus


def plan(model: Model, gpu: str, gpus: int, global_batch: int | None = None, *, top: int = 5,
         attention: str = "flash", framework: str = "deepspeed", memory_fraction: float = 0.9, zeropp: bool = True):
    """(search result, [(row, SimResult)] for its ``top`` fastest fitting plans); PlanError if impossible."""
    if gpu not in GPUS:
        raise PlanError(f"--gpu {gpu!r} is not a GPU preset; choose one of: {', '.join(GPUS)}")
    try:
        cluster = advice.cluster_of(gpu, gpus)
    except ValueError as e:
        raise PlanError(f"--gpus: {e}") from None
    # Cheapest possible placement first: ZeRO-3 with everything on NVMe and full recomputation
    # still keeps 16-bit weights of one layer and the activations of one; the states need room somewhere.
    states = 16 * model.num_params
    room = gpus * GPUS[gpu].hbm_bytes + cluster.nodes * (cluster.cpu_bytes + cluster.nvme_bytes)
    if states > room:
        raise PlanError(f"--model {model.name}: {model.num_params / 1e9:.1f} B parameters need {states / 1e12:.1f} TB "
                        f"of model states (16 bytes each), more than {gpus} × {gpu} with their hosts' memory and NVMe "
                        f"hold ({room / 1e12:.1f} TB); add GPUs")
    global_batch = global_batch or default_global_batch(model, gpus)
    space = search.Space(attention=attention, framework=framework, zeropp=zeropp)
    costs = calibrate()
    try:
        result = search.search(model, cluster, global_batch, space, costs, top=top, memory_fraction=memory_fraction)
    except search.NoPlanFits as e:
        raise PlanError(f"--model {model.name} on {gpus} × {gpu}: {e}") from None
    except ValueError as e:
        raise PlanError(f"--global-batch {global_batch}: {e}") from None
    best = [(row, simulate(model, cluster, row.plan, costs, granularity=row.granularity))
            for row in result.feasible[:top]]
    return result, best


def table(result, best) -> str:
    model, cluster = result.model, result.cluster
    tokens = result.global_batch * model.seq
    lines = [f"{model.name} ({model.num_params / 1e9:.2f} B parameters, seq {model.seq}) on {cluster.world_size} × "
             f"{cluster.gpu.name}, global batch {result.global_batch} sequences ({tokens:,} tokens); "
             f"{result.stats['enumerated']} plans, {len(result.feasible)} simulated that fit "
             f"{result.memory_limit / GiB:.0f} GiB per GPU",
             f"{'#':>2} {'plan':<56} {'step s':>7} {'MFU':>6} {'tok/s/GPU':>9} | GPU GiB: {'params':>6} {'grads':>6} "
             f"{'optim':>6} {'activ':>6} {'other':>6} {'peak':>6} | host GiB"]
    for i, (row, r) in enumerate(best, 1):
        p = r.memory.peak(0, "gpu")
        other = p["zero3_gathered"] + p["comm_bucket"]
        host = r.memory.peak(0, "cpu")["total"]
        lines.append(f"{i:>2} {search.describe(row.plan):<56} {r.step_time:7.2f} {r.mfu:6.1%} "
                     f"{tokens / r.step_time / cluster.world_size:9,.0f} | {'':>8} {p['param'] / GiB:6.1f} "
                     f"{p['grad'] / GiB:6.1f} {p['optim'] / GiB:6.1f} {p['activation'] / GiB:6.1f} {other / GiB:6.1f} "
                     f"{p['total'] / GiB:6.1f} | {host / GiB:8.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description="Plan a training run on the simulator.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="rank the plans that fit; write the best as a DeepSpeed config")
    p.add_argument("--model", required=True, help="a preset name or a HuggingFace config.json path")
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs (8 per node above 8)")
    p.add_argument("--gpu", default="H100-80GB", help=f"GPU preset: {', '.join(GPUS)}")
    p.add_argument("--seq", type=int, help="sequence length (default: the model's)")
    p.add_argument("--global-batch", type=int, help="sequences per step (default: about 4 Mi tokens)")
    p.add_argument("--top", type=int, default=5, help="how many plans to show")
    p.add_argument("--attention", choices=("flash", "eager"), default="flash")
    p.add_argument("--framework", choices=search.SPACE_FRAMEWORKS, default="deepspeed",
                   help="whose collectives and constraints the plans follow (default: deepspeed)")
    p.add_argument("--zeropp", action=argparse.BooleanOptionalAction, default=True,
                   help="also try ZeRO++ (hpZ, qwZ + hpZ + qgZ) for ZeRO-3 plans whose data parallelism spans nodes "
                        "(default: on)")
    p.add_argument("--write-config", type=Path, help="write the best plan's DeepSpeed config here")
    args = parser.parse_args(argv)
    try:
        if args.seq is not None and args.seq < 1:
            raise PlanError(f"--seq must be a positive integer, got {args.seq}")
        if args.write_config and args.framework in ("megatron", "fsdp2"):
            raise PlanError(f"--write-config writes a DeepSpeed config; a --framework {args.framework} plan has none "
                            "(drop --write-config, or plan with --framework deepspeed)")
        model = load_model(args.model, args.seq)
        result, best = plan(model, args.gpu, args.gpus, args.global_batch, top=args.top, attention=args.attention,
                            framework=args.framework, zeropp=args.zeropp)
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(result, best))
    chosen = best[0][0].plan
    where = "outside the DeepSpeed config" if chosen.framework == "deepspeed" else f"{chosen.framework} settings"
    fsdp = (f" reshard_after_forward={chosen.reshard_after_forward} reduce_dtype={chosen.reduce_dtype}"
            if chosen.framework == "fsdp2" else "")
    print(f"\nchosen: {search.describe(chosen)}; {where}: tp={chosen.tp} pp={chosen.pp} "
          f"cp={chosen.cp}{f' ({chosen.cp_kind})' if chosen.cp > 1 else ''} "
          f"recompute={chosen.recompute} sequence_parallel={chosen.sequence_parallel} schedule={chosen.schedule} "
          f"attention={chosen.attention}{fsdp}")
    if args.write_config:
        args.write_config.write_text(json.dumps(chosen.to_deepspeed(), indent=2) + "\n")
        print(f"wrote {args.write_config} (dp = {chosen.dp})")
    return 0
