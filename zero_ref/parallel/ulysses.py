"""DeepSpeed-Ulysses: swap a sequence shard for a head shard around attention, with all-to-all.

    out = ulysses_attention(q, k, v, sp_group)   # q, k, v, out: [s/cp, b, heads, d] on every rank

Before attention each rank holds s/cp tokens of every head. One all-to-all per tensor (Q, K, V)
gives it every token of heads/cp heads: attention is per head, so each rank then runs ordinary
full-sequence attention (any kernel: FlashAttention, causal, ...) on its heads, and a fourth
all-to-all turns the output back into sequence shards. Backward runs the four all-to-alls on the
gradients. Each all-to-all hands over the rank's whole tensor and keeps 1/cp of it, so the bytes
per rank fall as 1/cp as the group grows (``zero_ref.parallel.context.ulysses_bytes``), where ring
attention's stay constant. The price: cp can be at most the number of heads, and must divide it.

The sequence is split in contiguous runs (rank r holds tokens [r·s/cp, (r+1)·s/cp)): after the
swap every rank holds the whole sequence, so causal work is balanced without a zig-zag.

How DeepSpeed does it: ``deepspeed/sequence/layer.py``, ``DistributedAttention`` with
``_SeqAllToAll`` (scatter_idx 2 = heads, gather_idx 0 = sequence, the same [s, b, heads, d] layout
and the same head order: rank r gets heads [r·heads/cp, (r+1)·heads/cp)). It also handles head
counts that do not divide (``uneven_heads_all2all``) and can overlap the all-to-alls with the
projections on a second CUDA stream; zero_ref does neither.
"""
from __future__ import annotations

import torch.distributed as dist

from zero_ref.parallel.attention import causal_attention
from zero_ref.parallel.context import check_ulysses
from zero_ref.parallel.mappings import all_to_all


def sequence_to_heads(x, group):
    """[s/cp, b, H, d] (a sequence shard, every head) -> [s, b, H/cp, d] (every token, this rank's heads)."""
    cp = dist.get_world_size(group)
    s_local, b, heads, d = x.shape
    check_ulysses(heads, cp)
    chunks = x.reshape(s_local, b, cp, heads // cp, d).permute(2, 0, 1, 3, 4)   # chunk j: head group j
    return all_to_all(chunks, group).reshape(cp * s_local, b, heads // cp, d)  # received: sequence order


def heads_to_sequence(x, group):
    """[s, b, H/cp, d] -> [s/cp, b, H, d]: the inverse of ``sequence_to_heads``."""
    cp = dist.get_world_size(group)
    s, b, local_heads, d = x.shape
    chunks = x.reshape(cp, s // cp, b, local_heads, d)                          # chunk j: rank j's tokens
    return all_to_all(chunks, group).permute(1, 2, 0, 3, 4).reshape(s // cp, b, cp * local_heads, d)


def ulysses_attention(q, k, v, group=None, attention=causal_attention):
    """``attention`` over the whole sequence, run on heads/cp heads per rank; in and out: [s/cp, b, heads, d]."""
    check_ulysses(q.shape[2], dist.get_world_size(group), k.shape[2])
    q, k, v = (sequence_to_heads(t, group) for t in (q, k, v))
    return heads_to_sequence(attention(q, k, v), group)
