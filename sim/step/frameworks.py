"""Whose collectives: what each framework's data parallelism issues per step (Plan.framework).

sim.step.lowering asks this module which collectives reduce a bucket of gradients, over which
group the parameters are gathered, and whether the step ends with a parameter all-gather.
Per rank and step, with Ψ the parameters a rank's stage holds, n = dp and m micro-batches (ring
volumes in elements; ``sim.step.traffic`` counts them in a graph, ``zero_ref.volume`` has them in
closed form):

    deepspeed 0.19.8   stage 0     all-reduce of the gradients             2Ψ(n−1)/n
                       stage 1     all-reduce + parameter all-gather       3Ψ(n−1)/n
                       stage 2     the same, the all-reduce per micro-step (2m + 1)Ψ(n−1)/n
                       stage 3     2 all-gathers + reduce-scatter per micro-step  3mΨ(n−1)/n
    megatron           stage 0     all-reduce                              2Ψ(n−1)/n
                       stage 1     reduce-scatter + all-gather (the ZeRO paper's) 2Ψ(n−1)/n
    zero_ref           stages 1–3  the ZeRO paper's: reduce-scatter (per micro-step from stage 2)
                                   + all-gather; stage 3 as DeepSpeed's
    fsdp2              reshard     2 all-gathers + reduce-scatter per micro-step  3mΨ(n−1)/n
                       no reshard  1 all-gather + reduce-scatter per micro-step   2mΨ(n−1)/n
                       HSDP        the same within the shard group (n = dp_shard), plus an
                                   all-reduce of the 1/dp_shard shard across the replicas

The sources (file and function of each framework):

- DeepSpeed 0.19.8, stage 0: runtime/engine.py ``DeepSpeedEngine.allreduce_gradients`` →
  ``buffered_allreduce_fallback`` (all-reduce at the accumulation boundary).
- DeepSpeed stages 1–2: runtime/zero/stage_1_and_2.py ``DeepSpeedZeroOptimizer.reduce_ipg_grads``
  → ``average_tensor``: with ``use_multi_rank_bucket_allreduce`` (zero/config.py, default True)
  every slice goes to ``allreduce_and_scatter`` → ``allreduce_and_copy_with_multiple_ranks``, an
  all-reduce of the bucket of which each rank keeps its slice; stage 1 (``partition_gradients``
  False) reduces at the accumulation boundary (``reduce_gradients``; without overlap_comm the
  non-contiguous path ``buffered_reduce_fallback`` → ``allreduce_and_copy`` is an all-reduce too),
  stage 2 every micro-step (``reduce_ready_partitions_and_remove_grads``). ``step`` then calls
  runtime/utils.py ``all_gather_dp_groups`` on the updated 16-bit parameters.
- DeepSpeed stage 3: runtime/zero/stage3.py ``DeepSpeedZeroOptimizer_Stage3.__avg_scatter_grads``
  → runtime/comm/coalesced_collectives.py ``reduce_scatter_coalesced``; parameters are gathered by
  runtime/zero/partitioned_param_coordinator.py ``fetch_sub_module`` (forward and backward).
- Megatron-Core: megatron/core/distributed/param_and_grad_buffer.py
  ``_ParamAndGradBucketGroup.start_grad_sync`` (reduce-scatter of each bucket with
  ``use_distributed_optimizer``, else all-reduce; registered on the last micro-batch only,
  ``register_grad_ready``) and ``start_param_sync`` (the parameter all-gather: synchronous after
  ``optimizer/distrib_optimizer.py`` ``DistributedOptimizer``'s step, or with
  ``overlap_param_gather`` asynchronous, waited for by ``finish_param_sync`` in
  distributed_data_parallel.py's forward pre-hook, which dispatches the next bucket's gather).
- FSDP2 (torch 2.13): torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
  ``foreach_all_gather`` (one flat all-gather per unit, in FSDPParamGroup.unshard, the next unit
  prefetched: ``_fsdp_param_group.py`` ``FSDPParamGroup._prefetch_unshard`` /
  ``_backward_prefetch``) and ``foreach_reduce`` (a reduce-scatter in ``reduce_dtype`` over the
  shard group, then, HSDP, an all-reduce over ``all_reduce_group``); ``post_forward`` calls
  ``FSDPParamGroup.reshard``, which keeps the parameters gathered in the forward unless
  ``reshard_after_forward``, and ``post_backward`` reshards always. Gradients are reduced every
  micro-batch (FSDPModule.set_requires_gradient_sync(False) would defer them; not modelled).
- zero_ref: zero_ref/stages (comm.reduce_scatter of each bucket, comm.all_gather after the step).

Not modelled: DeepSpeed's stage 0 reduces after the backward (``allreduce_gradients`` runs in
``_backward_epilogue``), here bucket by bucket during it as ``overlap_comm`` says; FSDP2 without
reshard_after_forward under pipeline parallelism gathers each micro-batch's units once, in its
forward, and holds them to its backward (FSDP2 re-gathers a unit a backward resharded); FSDP2's
sharded states are fp32 parameters and gradients where zero_ref.memory's recipe books 16-bit ones
and an fp32 master copy (the same 16 bytes per parameter over dp_shard).
"""
from __future__ import annotations

from sim.cost.work import Collective

REDUCE_DTYPE_BYTES = {"fp32": 4, "bf16": 2}


def gather_axis(plan) -> str:
    """The group ZeRO-3 / FSDP2 parameters are all-gathered over: the shard group under HSDP."""
    return "dp_shard" if plan.replicas > 1 else "dp"


def grad_reduce(plan, params: float, grad_bytes: int) -> list[Collective]:
    """The collectives, in order, that reduce one bucket of ``params`` gradients over data parallelism."""
    if plan.zero_stage == 0:
        return [Collective("all_reduce", params * grad_bytes, "dp")]
    if plan.framework == "deepspeed":
        op = "all_reduce" if plan.zero_stage in (1, 2) else "reduce_scatter"
        return [Collective(op, params * grad_bytes, "dp")]
    if plan.framework in ("megatron", "zero_ref"):
        return [Collective("reduce_scatter", params * grad_bytes, "dp")]
    nbytes = params * REDUCE_DTYPE_BYTES[plan.reduce_dtype]
    out = [Collective("reduce_scatter", nbytes, gather_axis(plan))]
    if plan.replicas > 1:
        out.append(Collective("all_reduce", nbytes / plan.shard_group, "dp_replica"))
    return out


def gathers_after_step(plan) -> bool:
    """Whether the updated parameters are all-gathered after the optimizer step (ZeRO-1/2 and
    Megatron's distributed optimizer; ZeRO-3 and FSDP2 gather before each use instead)."""
    return plan.zero_stage in (1, 2)


def gathers_in_next_forward(plan) -> bool:
    """Megatron's overlap_param_gather: the step's parameter all-gather runs during the next step's
    first forward, bucket by bucket, each layer waiting for its own (in a steady state: this step's)."""
    return plan.overlap_param_gather and plan.dp * plan.cp > 1


def reduces_per_unit(plan) -> bool:
    """FSDP2 reduce-scatters each unit's gradients when its backward ends, whatever the bucket size,
    on its own stream (overlapped whatever ``overlap_comm`` says)."""
    return plan.framework == "fsdp2"


def keeps_gathered(plan) -> bool:
    """FSDP2 without reshard_after_forward: a unit's parameters stay gathered from its forward to
    the end of its backward, which gathers nothing."""
    return plan.framework == "fsdp2" and not plan.reshard_after_forward
