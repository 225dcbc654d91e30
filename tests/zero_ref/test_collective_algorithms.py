"""Ring and binomial-tree all-reduce from point-to-point messages equal gloo's all_reduce; their
steps and the bytes each rank sends are the theory's, counted by the comm layer."""
import pytest
import torch

import zero_ref
from zero_ref import collective_algorithms as ca

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

SIZES = (1, 7, 12, 1000, 1003)


def run(rank, world, sizes):
    import torch
    from zero_ref import collective_algorithms as ca, comm
    out = []
    for numel in sizes:
        # integers in float32: every summation order gives the same bits, so equality is exact
        x = (torch.arange(numel, dtype=torch.float32) % 97) * (rank + 1) + rank
        expected = x.clone()
        comm.all_reduce(expected)
        ring, tree = x.clone(), x.clone()
        with comm.recording() as ring_log:
            ca.ring_all_reduce_(ring)
        with comm.recording() as tree_log:
            ca.tree_all_reduce_(tree)
        out.append((numel, torch.equal(ring, expected), torch.equal(tree, expected),
                    ring_log.total_bytes("send"), len([r for r in ring_log.records if r.op == "send"]),
                    tree_log.total_bytes("send"), len([r for r in tree_log.records if r.op in ("send", "recv")])))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_and_tree_equal_all_reduce_and_count_bytes(world):
    results = zero_ref.launch(run, world, SIZES, timeout=120)
    for rank, rows in enumerate(results):
        for numel, ring_ok, tree_ok, ring_bytes, ring_sends, tree_bytes, tree_msgs in rows:
            assert ring_ok and tree_ok, (world, rank, numel)
            assert ring_bytes == ca.ring_send_bytes(numel, world, rank)
            assert ring_sends == ca.ring_steps(world)  # one send per step
            if numel % world == 0:
                assert ring_bytes == 2 * (world - 1) / world * numel * 4
    # the tree: every rank but 0 sends its buffer up once; each parent sends it down to each child
    totals = [sum(rows[i][5] for rows in results) for i in range(len(SIZES))]
    assert totals == [2 * (world - 1) * n * 4 for n in SIZES]
    longest = max(rows[0][6] for rows in results)  # messages on the busiest rank (rank 0)
    assert longest == ca.tree_steps(world)


def test_steps_and_chunk_sizes():
    assert [ca.ring_steps(n) for n in (1, 2, 4, 8)] == [0, 2, 6, 14]
    assert [ca.tree_steps(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [0, 2, 4, 4, 6, 6, 8]
    for numel in range(0, 40):
        for n in range(1, 9):
            assert ca._chunk_sizes(numel, n) == [len(c) for c in torch.arange(numel).tensor_split(n)]
            # summed over ranks each chunk is left out twice: 2(n − 1) · numel elements
            assert sum(ca.ring_send_bytes(numel, n, r) for r in range(n)) == 4 * 2 * (n - 1) * numel
