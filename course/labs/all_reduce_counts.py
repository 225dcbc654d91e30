"""The two hand-written all-reduces of chapter 17 (ring and tree) on one rank: do they equal gloo's, and what
did this rank send (bytes, messages)."""
from __future__ import annotations

import torch

from zero_ref import collective_algorithms, comm


def ring_and_tree_counts(rank: int, world: int, sizes) -> dict:
    """For each buffer size: whether ``ring_all_reduce_`` and ``tree_all_reduce_`` left gloo's all-reduce in the
    buffer, the bytes this rank sent and its number of sends (the tree's count: every call it made)."""
    rows = {}
    for numel in sizes:
        v = (torch.arange(numel, dtype=torch.float32) % 97) * (rank + 1)  # integers: exact in any order
        expected = v.clone()
        comm.all_reduce(expected)
        ring, tree = v.clone(), v.clone()
        with comm.recording() as ring_log:
            collective_algorithms.ring_all_reduce_(ring)
        with comm.recording() as tree_log:
            collective_algorithms.tree_all_reduce_(tree)
        rows[numel] = dict(ring_equal=torch.equal(ring, expected), tree_equal=torch.equal(tree, expected),
                           ring_sent=ring_log.total_bytes("send"),
                           ring_messages=sum(r.op == "send" for r in ring_log.records),
                           tree_sent=tree_log.total_bytes("send"), tree_messages=len(tree_log.records))
    return rows
