"""Tensor- and sequence-parallel communication as autograd functions, named after what forward does.

Megatron's "f" and "g" operators and their sequence-parallel counterparts. Each one's docstring
says what forward and backward do; the pairs are conjugate (an all-reduce in one direction is the
identity in the other; an all-gather is a reduce-scatter). Tensors are [s, b, h]: the sequence is
dim 0 (so a sequence shard is contiguous) and features are the last dim. Every collective goes
through ``zero_ref.comm``, so ``comm.recording()`` counts it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from zero_ref import comm


def _gather_last(x, group):
    n = dist.get_world_size(group)
    out = torch.empty((n * x.shape[0],) + x.shape[1:], dtype=x.dtype, device=x.device)
    comm.all_gather(out, x.contiguous(), group=group)  # rank-major along dim 0 ...
    return torch.cat(out.chunk(n, dim=0), dim=-1)      # ... moved to the feature dim


def _split_last(x, group):
    return x.chunk(dist.get_world_size(group), dim=-1)[dist.get_rank(group)].contiguous()


def _gather_seq(x, group):
    out = torch.empty((dist.get_world_size(group) * x.shape[0],) + x.shape[1:], dtype=x.dtype, device=x.device)
    comm.all_gather(out, x.contiguous(), group=group)
    return out


def _reduce_scatter_seq(x, group):
    n = dist.get_world_size(group)
    if x.shape[0] % n:
        raise ValueError(f"sequence parallelism: sequence length {x.shape[0]} is not divisible by tp={n}")
    out = torch.empty((x.shape[0] // n,) + x.shape[1:], dtype=x.dtype, device=x.device)
    comm.reduce_scatter(out, x.contiguous(), group=group)
    return out


def _split_seq(x, group):
    n = dist.get_world_size(group)
    if x.shape[0] % n:
        raise ValueError(f"sequence parallelism: sequence length {x.shape[0]} is not divisible by tp={n}")
    return x.chunk(n, dim=0)[dist.get_rank(group)].contiguous()


def _all_to_all(x, group):
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    comm.all_to_all(out, x.contiguous(), group=group)
    return out


def _all_reduce(x, group):
    x = x.clone(memory_format=torch.contiguous_format)  # never reduce in place into a tensor autograd holds
    comm.all_reduce(x, group=group)
    return x


class CommOp(torch.autograd.Function):
    """An autograd Function whose forward is ``fwd`` and whose backward is ``bwd``: each a collective or a slice."""
    fwd = bwd = staticmethod(lambda x, group: x)

    @classmethod
    def forward(cls, ctx, x, group):
        ctx.group = group
        return cls.fwd(x, group)

    @classmethod
    def backward(cls, ctx, grad):
        return cls.bwd(grad, ctx.group), None


class CopyToTP(CommOp):
    """Forward: identity (every rank already holds X). Backward: all-reduce the input gradient."""
    bwd = staticmethod(_all_reduce)


class ReduceFromTP(CommOp):
    """Forward: all-reduce the partial sums. Backward: identity."""
    fwd = staticmethod(_all_reduce)


class GatherFromTP(CommOp):
    """Forward: all-gather the feature slices (last dim). Backward: keep this rank's slice."""
    fwd, bwd = staticmethod(_gather_last), staticmethod(_split_last)


class ScatterToTP(CommOp):
    """Forward: keep this rank's feature slice (last dim). Backward: all-gather the slices."""
    fwd, bwd = staticmethod(_split_last), staticmethod(_gather_last)


class GatherFromSequence(CommOp):
    """Forward: all-gather the sequence shards (dim 0). Backward: reduce-scatter the gradient."""
    fwd, bwd = staticmethod(_gather_seq), staticmethod(_reduce_scatter_seq)


class ReduceScatterToSequence(CommOp):
    """Forward: reduce-scatter the partial sums into sequence shards. Backward: all-gather."""
    fwd, bwd = staticmethod(_reduce_scatter_seq), staticmethod(_gather_seq)


class ScatterToSequence(CommOp):
    """Forward: keep this rank's sequence shard. Backward: all-gather the gradient."""
    fwd, bwd = staticmethod(_split_seq), staticmethod(_gather_seq)


class AllToAll(CommOp):
    """Forward: equal-split all-to-all along dim 0 (chunk j goes to rank j). Backward: the same
    all-to-all on the gradient (it sends each chunk back where it came from)."""
    fwd = bwd = staticmethod(_all_to_all)


def copy_to_tp(x, group):
    return CopyToTP.apply(x, group)


def reduce_from_tp(x, group):
    return ReduceFromTP.apply(x, group)


def gather_from_tp(x, group):
    return GatherFromTP.apply(x, group)


def scatter_to_tp(x, group):
    return ScatterToTP.apply(x, group)


def gather_from_sequence(x, group):
    return GatherFromSequence.apply(x, group)


def reduce_scatter_to_sequence(x, group):
    return ReduceScatterToSequence.apply(x, group)


def scatter_to_sequence(x, group):
    return ScatterToSequence.apply(x, group)


def all_to_all(x, group):
    """Differentiable equal-split all-to-all (MoE dispatch and combine, Ulysses' sequence ↔ head swap)."""
    return AllToAll.apply(x, group)


class _LinearGatherSequence(torch.autograd.Function):
    """Forward: all-gather X's sequence shards, then X·Wᵀ + b, saving only the shard.
    Backward: all-gather X again for dW, and reduce-scatter dX back into sequence shards."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)  # the 1/t shard: what makes sequence parallelism save memory
        return F.linear(_gather_seq(x, group), weight, bias)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        full = _gather_seq(x, ctx.group)  # Megatron overlaps this gather with the dX matmul
        gx = _reduce_scatter_seq(gy @ weight, ctx.group)
        gw = gy.reshape(-1, gy.shape[-1]).t() @ full.reshape(-1, full.shape[-1])
        gb = gy.reshape(-1, gy.shape[-1]).sum(0) if ctx.has_bias else None
        return gx, gw, gb, None
