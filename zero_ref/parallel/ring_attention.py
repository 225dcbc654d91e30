"""Ring attention: causal attention with the sequence split over a context-parallel group.

    local = zigzag_split(x, cp, rank)                  # [s/cp, b, heads, d]: chunks rank and 2cp−1−rank
    out = ring_attention(q_local, k_local, v_local, cp_group)   # equal to this rank's rows of full attention

Every rank keeps its own queries and passes its key/value block round the ring: in step i it
attends its queries to the block that started on rank r − i, while sending that block on to rank
r + 1 and receiving the next one from r − 1 (``comm.isend``/``irecv``, so the transfer runs
while the block computes). The blocks' partial results are merged with the online softmax
(``attention.merge``), so no rank ever holds more than an (s/cp) × (s/cp) score block, and after
cp steps each rank has the exact attention of its own tokens over every key they may see.

Backward runs the ring again, recomputing each block's probabilities from the saved log-sum-exp
(FlashAttention's backward). The gradient of a key/value block is summed on the ranks whose
queries saw it, so dK, dV travel with their block and take one more step at the end, home. Bytes
sent per layer: ``zero_ref.parallel.context.ring_bytes``. The split is the zig-zag one
(``context.zigzag_positions``) so every rank does the same causal work.

How Megatron does it: Megatron-Core's context parallelism calls Transformer Engine's
``AttnFuncWithCPAndKVP2P`` (the same ring, the same zig-zag split, with fused kernels and two
CUDA streams); DeepSpeed 0.19.8 has no ring attention and offers Ulysses (``ulysses.py``) instead.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from zero_ref import comm
from zero_ref.parallel.attention import block_backward, block_forward, merge
from zero_ref.parallel.context import check_zigzag, zigzag_chunks, zigzag_positions


def zigzag_split(x: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """This rank's shard of a full [s, ...] tensor: chunks rank and 2·cp − 1 − rank of 2·cp, along dim 0."""
    check_zigzag(x.shape[0], cp)
    chunks = x.chunk(2 * cp, dim=0)
    return torch.cat([chunks[c] for c in zigzag_chunks(cp, rank)]).contiguous()


def zigzag_merge(shards: list[torch.Tensor]) -> torch.Tensor:
    """The full [s, ...] tensor from every rank's shard (rank order): the inverse of ``zigzag_split``."""
    cp = len(shards)
    chunks: list = [None] * (2 * cp)
    for r, shard in enumerate(shards):
        early, late = shard.chunk(2, dim=0)
        chunks[r], chunks[2 * cp - 1 - r] = early, late
    return torch.cat(chunks)


class _Ring:
    """This rank's place in the ring: neighbours (global ranks) and the mask against each block."""

    def __init__(self, group, s_local: int, device):
        self.group, self.cp, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(self.cp))
        self.next, self.prev = ranks[(self.rank + 1) % self.cp], ranks[(self.rank - 1) % self.cp]
        seq = s_local * self.cp
        self.pos = [torch.tensor(zigzag_positions(seq, self.cp, r), device=device) for r in range(self.cp)]

    def owner(self, step: int) -> int:
        """The rank whose key/value block this rank holds at ``step``."""
        return (self.rank - step) % self.cp

    def mask(self, step: int) -> torch.Tensor:
        """[s/cp, s/cp] causal mask of this rank's queries against that block's keys (global positions)."""
        return self.pos[self.owner(step)].unsqueeze(0) <= self.pos[self.rank].unsqueeze(1)

    def start_pass(self, block: torch.Tensor):
        """Send ``block`` to the next rank and receive the previous rank's: (buffer, handles)."""
        buffer = torch.empty_like(block)
        return buffer, [comm.isend(block, self.next, self.group), comm.irecv(buffer, self.prev, self.group)]


def _seq_first(t: torch.Tensor) -> torch.Tensor:
    """[b, heads, s, d] (the kernels' layout) -> [s, b, heads, d] (the callers')."""
    return t.permute(2, 0, 1, 3).contiguous()


def _wait(handles) -> None:
    for h in handles:
        h.wait()


class _RingAttention(torch.autograd.Function):
    """Forward: cp steps of attend-to-block while the K/V block moves on. Backward: the same ring,
    with dK/dV travelling beside their block and one step home at the end."""

    @staticmethod
    def forward(ctx, q, k, v, group):
        ring = _Ring(group, q.shape[0], q.device)
        qh = q.permute(1, 2, 0, 3)                                   # [b, heads, s/cp, d]
        kv = torch.stack([k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)]).contiguous()
        out = lse = None
        for step in range(ring.cp):
            last = step == ring.cp - 1
            if not last:
                incoming, handles = ring.start_pass(kv)              # overlaps the block below
            block_out, block_lse = block_forward(qh, kv[0], kv[1], ring.mask(step))
            # step 0 is the rank's own block, where every query sees at least itself: lse is finite
            out, lse = (block_out, block_lse) if step == 0 else merge(out, lse, block_out, block_lse)
            if not last:
                _wait(handles)
                kv = incoming
        ctx.group = group
        ctx.save_for_backward(q, k, v, out, lse)
        return _seq_first(out)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group, q.shape[0], q.device)
        qh, dout = q.permute(1, 2, 0, 3), grad.permute(1, 2, 0, 3)
        kv = torch.stack([k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)]).contiguous()
        dq, dkv = torch.zeros_like(qh), torch.zeros_like(kv)
        for step in range(ring.cp):
            last = step == ring.cp - 1
            if not last:
                incoming, handles = ring.start_pass(kv)
            dq_b, dk_b, dv_b = block_backward(qh, kv[0], kv[1], out, lse, dout, ring.mask(step))
            dq += dq_b
            dkv += torch.stack([dk_b, dv_b])
            if not last:
                _wait(handles)
                kv = incoming
            if ring.cp > 1:       # the block's gradient follows it; after the last step it arrives home
                dkv, handles = ring.start_pass(dkv)
                _wait(handles)
        return _seq_first(dq), _seq_first(dkv[0]), _seq_first(dkv[1]), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None) -> torch.Tensor:
    """Causal attention of this rank's zig-zag shard [s/cp, b, heads, d] over the whole sequence.

    q, k, v must have the same shape (multi-head attention) and an even local length (two chunks)."""
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"ring_attention: q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[0] % 2:
        raise ValueError(f"ring_attention: the local sequence ({q.shape[0]}) holds two zig-zag chunks, so it must be even")
    return _RingAttention.apply(q, k, v, group)
