"""ZeRO++ qgZ: gradients reduced by a hierarchical, int4-quantized all-to-all instead of a reduce-scatter.

N ranks in M nodes of L consecutive ranks; rank r = (node m, local l) must end with the sum over all ranks
of chunk r of the flat gradient buffer (row r: its shard). The paper's two steps (Wang et al. 2023, §4.3):

1. inside the node: chunks reordered by local index, so local rank l receives chunks (0,l) … (M−1,l) from
   each of the node's L ranks; an all-to-all of int4 blocks; l dequantizes and sums at full precision
   (the node's partial sums of its M chunks), and requantizes them;
2. across nodes, among the M ranks with the same local index: chunk (m,l) goes to node m; an all-to-all of
   int4 blocks; each rank dequantizes and sums the M partial sums at full precision, in fp32.

Bytes each rank hands to the collectives per reduce (shard s elements, blocks of b; p(n): n rounded up to
a multiple of b): step 1: L·p(M·s)/2 + 4·L·p(M·s)/b; step 2 (M > 1): M·p(s)/2 + 4·M·p(s)/b. Across nodes
a rank sends (M−1)/M of step 2: int4 is a quarter of fp16's bytes for the same (M−1)·s elements (the paper's
count), plus the scales and padding.

DeepSpeed 0.19.8 (``all_to_all_quant_reduce``, runtime/comm/coalesced_collectives.py) does the same steps per
gradient tensor with its CUDA ``swizzle_quant`` / ``quantized_reduction`` (int4); its node is
``accelerator.device_count()`` ranks and with one node it reduce-scatters unquantized (stage3.py,
``__avg_scatter_grads``). Here the node is ``zero_hpz_partition_size`` ranks (or all ranks: one node, step 1 only).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from zero_ref import comm
from zero_ref.stages.gradient_shards import GradientShards
from zero_ref.stages.zero3 import block_quant
from zero_ref.stages.zero3.secondary_partition import subgroups

BITS = 4  # DeepSpeed's qgZ: int4 (all_to_all_quant_reduce passes 4 bits)
# DeepSpeed's qgZ cuts each 2-D gradient into max(rows, cols, world) groups: blocks of about one row (its hidden
# size, thousands of elements at scale). A flat bucket has no rows: fixed blocks of 512 (4 scale bytes per 256).
BLOCK = 512


def node_groups(ranks: list[int], node_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(intra-node groups, inter-node groups): consecutive ``node_size`` ranks, and ranks of equal local index.

    >>> node_groups([0, 1, 2, 3], 2)
    ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    """
    intra = subgroups(ranks, node_size)
    return intra, [list(col) for col in zip(*intra)]


class QuantizedReduce:
    """The hierarchical quantized reduce of ``group`` with nodes of ``node_size`` ranks (every rank builds it)."""

    def __init__(self, group, node_size: int, block: int = BLOCK):
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        self.world, self.node_size, self.nodes = len(ranks), node_size, len(ranks) // node_size
        intra, inter = node_groups(ranks, node_size)
        me = dist.get_rank()
        self.intra = self.inter = None
        for sub in intra:
            g = dist.new_group(sub)
            self.intra = g if me in sub else self.intra
        for sub in inter:
            g = dist.new_group(sub) if len(sub) > 1 else None
            self.inter = g if me in sub else self.inter
        if block <= 0 or block % 8:
            raise ValueError(f"QuantizedReduce: block must be a positive multiple of 8, got {block}")
        self.quantize, self.dequantize, self.block = block_quant.quantize, block_quant.dequantize, block

    def __call__(self, output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
        """``output`` ← the sum over ranks of chunk (this rank) of ``input``; reduce_scatter's signature."""
        M, L = self.nodes, self.node_size
        s = output.numel()
        chunks = input.detach().reshape(M, L, s).float()
        # step 1: to local rank l go chunks (0,l) … (M-1,l)
        send = chunks.transpose(0, 1).reshape(L, M * s)
        partial = self._exchange(send, L, self.intra).sum(dim=0)  # (M·s): this node's sums of its chunks
        # step 2: chunk (m, l) to node m
        total = self._exchange(partial.reshape(M, s), M, self.inter).sum(dim=0) if M > 1 else partial
        output.copy_(total.to(output.dtype))
        return None

    def _exchange(self, rows: torch.Tensor, n: int, group) -> torch.Tensor:
        """Row j to rank j of ``group`` as int4 blocks; the ``n`` rows received, dequantized (fp32)."""
        width = rows.shape[1]
        q, scales = self.quantize(rows, bits=BITS, rows=n, block=self.block)
        q_in, s_in = torch.empty_like(q), torch.empty_like(scales)
        comm.all_to_all(q_in, q, group=group)
        comm.all_to_all(s_in, scales, group=group)
        return self.dequantize(q_in, s_in, width, bits=BITS, rows=n).reshape(n, width)


class QuantizedShards(GradientShards):
    """ZeRO-3's gradient path under qgZ: each reduce-scatter becomes the stage's ``QuantizedReduce``."""

    def __init__(self, opt, quantized_reduce: QuantizedReduce):
        super().__init__(opt)
        self.quantized_reduce = quantized_reduce

    def reduce(self, flat: torch.Tensor, into: list) -> None:
        """As ``GradientShards.reduce``, through the quantized all-to-all (synchronous)."""
        opt = self.opt
        n = flat.numel() // opt.world_size
        mine = flat[opt.rank * n:(opt.rank + 1) * n]
        self.quantized_reduce(mine, flat, group=opt.group)
        for part, offset in into:  # accumulates over micro-steps (on the host under offload)
            piece = mine[offset:offset + part.numel]
            if opt.offload is not None:
                opt.offload.add_grad(part, piece)
            else:
                part.grad.add_(piece)
