"""Chapter 17's grader for a hand-written ring all-reduce: it passes the library's ring algorithm, refuses
collectives, and leaves torch.distributed as it found it."""
import pytest
import torch.distributed as dist

import zero_ref
from course.labs import ch17
from zero_ref import collective_algorithms as ca
from zero_ref import comm


def _library_ring_copy(tensor):
    """The library's two halves, called under other names than the ones the grader refuses."""
    n, r, chunks = ca._ring(tensor)
    buf = tensor.new_empty(chunks[0].numel())
    for k in range(n - 1):
        send, recv = chunks[(r - k) % n], chunks[(r - k - 1) % n]
        work = comm.isend(send, dst=(r + 1) % n)
        comm.irecv(buf[:recv.numel()], src=(r - 1) % n).wait()
        work.wait()
        recv.add_(buf[:recv.numel()])
    for k in range(n - 1):
        work = comm.isend(chunks[(r + 1 - k) % n], dst=(r + 1) % n)
        comm.irecv(chunks[(r - k) % n], src=(r - 1) % n).wait()
        work.wait()


def test_point_to_point_only_restores_what_it_replaced():
    before = (dist.all_reduce, dist.isend, ca.ring_all_reduce_)
    with pytest.raises(ValueError):
        with ch17.point_to_point_only([]):
            assert dist.all_reduce is not before[0] and ca.ring_all_reduce_ is not before[2]
            raise ValueError("leaves the block")
    assert (dist.all_reduce, dist.isend, ca.ring_all_reduce_) == before


@pytest.mark.slow
def test_a_correct_ring_passes_with_the_ring_byte_count_and_neighbours():
    ranks = zero_ref.launch(ch17.grade_ring, 3, _library_ring_copy, (1000, 1001), timeout=120)
    for numel in (1000, 1001):
        assert [r[numel]["sent"] for r in ranks] == [ca.ring_send_bytes(numel, 3, r) for r in range(3)]
        assert all(r[numel]["equal"] for r in ranks)
        assert [(r[numel]["sends"], r[numel]["recvs"]) for r in ranks] == [([1], [2]), ([2], [0]), ([0], [1])]


@pytest.mark.slow
@pytest.mark.parametrize("cheat", [comm.all_reduce, ca.ring_all_reduce_], ids=["collective", "library ring"])
def test_the_collective_and_the_library_ring_are_refused(cheat):
    with pytest.raises(zero_ref.launcher.RankError, match="builds all-reduce from comm.isend"):
        zero_ref.launch(ch17.grade_ring, 2, lambda t: cheat(t), (16,), timeout=120)
