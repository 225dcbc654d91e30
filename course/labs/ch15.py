"""Chapter 15's harness: the multi-rank experiment (checkpointed, partitioned and CPU-checkpointed blocks on
tensor-parallel ranks) and what the selective-recompute task is measured with.

``zero_ref.launch(tp_ranks, 2, cfg, batch)`` runs the experiment; ``print_tp_runs`` prints what came back.
``LibraryRecomputeOff`` and ``kept_after_forward`` serve Task 15.2.
"""
from __future__ import annotations

OURS = ("checkpointed", "partitioned", "partitioned + cpu")


def tp_ranks(rank, world, cfg, batch):
    """One backward of the tensor-parallel GPT per way of checkpointing its blocks, DeepSpeed's last."""
    import os
    os.environ["DS_ACCELERATOR"] = "cpu"
    import torch
    import torch.distributed as dist

    from zero_ref import checkpointing, comm
    from zero_ref.measure import saved_activation_bytes
    from zero_ref.models import GPT
    from zero_ref.parallel.groups import build_groups
    from zero_ref.parallel.tensor import TensorParallelGPT
    from zero_ref.parallel.topology import Topology

    torch.manual_seed(0)
    model = TensorParallelGPT(GPT(cfg), dist.group.WORLD).train()
    groups = build_groups(Topology.for_world(world, tp=world), axes=("tp",))

    def run():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        x = model.embed(batch[0])
        with saved_activation_bytes(model) as acts:
            for block in model.blocks:
                x = block(x)
        loss = model.head_loss(x, batch[1])[1]
        with comm.recording() as log:
            loss.backward()
        return dict(loss=loss.item(), grads=[p.grad.clone() for p in model.parameters()], saved=acts.total,
                    tiers=dict(checkpointing.stats().saved_bytes), comm=log.by_op())

    runs = {"plain": run()}
    checkpointing.checkpoint_layers(model.blocks)
    for name, options in zip(OURS, [{}, dict(partition_activations=True),
                                     dict(partition_activations=True, checkpoint_in_cpu=True)]):
        checkpointing.configure(groups, **options)
        runs[name] = run()
    checkpointing.checkpoint_layers(model.blocks, 0)

    import deepspeed
    import deepspeed.ops
    from deepspeed import checkpointing as ds_checkpointing
    # gloo does every collective here: skip DeepSpeed's shared-memory all-reduce op (a C++ build on first use)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed("gloo")

    class MPU:  # the interface DeepSpeed asks of an mpu, over our tp group
        get_model_parallel_group = lambda self: groups.tp
        get_model_parallel_rank = lambda self: dist.get_rank(groups.tp)
        get_model_parallel_world_size = lambda self: dist.get_world_size(groups.tp)

    ds_checkpointing.configure(MPU(), partition_activations=True)
    for block in model.blocks:
        block.forward = (lambda f: lambda x: ds_checkpointing.checkpoint(f, x))(block.forward)
    runs["DeepSpeed partitioned"] = run()
    plain = runs["plain"]
    return {name: dict(same_loss=r["loss"] == plain["loss"], saved=r["saved"], tiers=r["tiers"],
                       grad_diff=max((a - b).abs().max().item() for a, b in zip(r["grads"], plain["grads"])),
                       all_gather=r["comm"].get("all_gather", {}).get("bytes", 0),
                       all_reduces=r["comm"]["all_reduce"]["calls"])
            for name, r in runs.items()}


def print_tp_runs(ranks):
    """One table per rank: bytes kept (autograd, per tier), all-gathered bytes, all-reduces, gradient difference."""
    for rank, runs in enumerate(ranks):
        print(f"rank {rank}:  {'run':<22}{'kept (autograd)':>16}{'device':>9}{'host':>9}{'all-gathered':>14}"
              f"{'all-reduces':>13}{'max |Δgrad|':>13}")
        for name, r in runs.items():
            # DeepSpeed keeps its inputs outside saved-tensor hooks and gathers through its own comm
            tiers = (f"{r['tiers']['device']:>9,}{r['tiers']['host']:>9,}" if name in OURS else f"{'—':>9}{'—':>9}")
            saved = f"{r['saved']:>16,}" if "DeepSpeed" not in name else f"{'(not visible)':>16}"
            gathered = f"{r['all_gather']:>14,}" if "DeepSpeed" not in name else f"{'(own comm)':>14}"
            print(f"         {name:<22}{saved}{tiers}{gathered}{r['all_reduces']:>13}{r['grad_diff']:>13.1g}")


class LibraryRecomputeOff:
    """Inside it, ``torch.utils.checkpoint``, zero_ref's ``checkpoint`` and the GPT's own ``recompute`` switch
    raise: a task that builds recomputation must not borrow it."""

    def __enter__(self):
        import torch.utils.checkpoint as tuc

        from zero_ref import activation_checkpointing as ours
        from zero_ref.ds import checkpointing as ds_ckpt
        from zero_ref.models import gpt

        def refuse(*args, **kwargs):
            raise RuntimeError("this task builds the recomputation itself: torch.utils.checkpoint, zero_ref's "
                               "checkpoint and GPTConfig(recompute=...) are switched off here")

        self._saved = [(mod, name, getattr(mod, name)) for mod in (tuc, gpt, ours, ds_ckpt)
                       for name in ("checkpoint", "checkpoint_sequential", "CheckpointFunction") if hasattr(mod, name)]
        for mod, name, _ in self._saved:
            setattr(mod, name, refuse)
        return self

    def __exit__(self, *exc):
        for mod, name, value in self._saved:
            setattr(mod, name, value)


def kept_after_forward(blocks, shape, dtype):
    """Bytes of every storage the blocks' forward allocated and still holds once it returns (the output's
    excepted): what they keep for backward, wherever it is kept (saved tensors or attributes of a context)."""
    import torch

    from zero_ref.measure import PeakTensorBytes

    with PeakTensorBytes() as live:
        x = torch.randn(*shape, dtype=dtype, requires_grad=True)  # as from the embedding; the first norm keeps it
        y = x
        for block in blocks:
            y = block(y)
    kept = live.live - y.untyped_storage().nbytes()
    y.float().sum().backward()
    return kept
