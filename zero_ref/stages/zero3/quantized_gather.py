"""ZeRO++ qwZ: a ZeRO-3 all-gather that moves int8 blocks and their fp32 scales, dequantized on arrival.

Each rank quantizes its own shard (``block_quant``, DeepSpeed's block count), and two all-gathers move the
integers and the scales; every rank then dequantizes all shards into the full buffer in the compute dtype.
Per gather and rank, the full buffers are ``N · (padded(s) + 4·blocks(padded(s)))`` bytes for a shard of
``s`` elements: half of fp16's ``N · 2s`` plus the scales, as DeepSpeed's ``_all_gather_coalesced``
(runtime/zero/partition_parameters.py, ``quantize=True``) sends them: one all-gather of int8, one of fp32 scales.
"""
from __future__ import annotations

import torch

from zero_ref import comm
from zero_ref.stages.zero3 import block_quant


def quantized_all_gather(full: torch.Tensor, shard: torch.Tensor, group=None) -> None:
    """``full`` ← every rank's ``shard`` end to end (rank order), each through int8 block quantization."""
    n, ranks = shard.numel(), comm.get_world_size(group)
    if full.numel() != n * ranks:
        raise ValueError(f"quantized_all_gather: full has {full.numel()} elements, expected {ranks} × {n}")
    q, scales = block_quant.quantize(shard, bits=8)
    q_all = q.new_empty(ranks * q.numel())
    s_all = scales.new_empty(ranks * scales.numel())
    comm.all_gather(q_all, q, group=group)
    comm.all_gather(s_all, scales, group=group)
    full.copy_(block_quant.dequantize(q_all, s_all, n, bits=8, rows=ranks, dtype=full.dtype))
