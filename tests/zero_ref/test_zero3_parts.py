"""ZeRO-3's parts that need no ranks: the recorded order of uses (prefetch.py) and reduce groups."""
from types import SimpleNamespace

import torch

from zero_ref.stages.zero3.prefetch import Trace, reuse_distances
from zero_ref.stages.zero3.reduce_group import reduce_groups


class unit:  # what these parts read of a unit: its name, gathered size and shard size (2 ranks)
    def __init__(self, name, size):
        self.name, self.size, self.layout = name, size, SimpleNamespace(shard_numel=size // 2)


def test_reuse_distance_counts_the_elements_used_in_between():
    a, b, c = unit("a", 10), unit("b", 20), unit("c", 30)
    # forward a b c, backward c b a: c is used again at once, a after b and c twice
    assert reuse_distances([a, b, c, c, b, a]) == [100, 60, 0, float("inf"), float("inf"), float("inf")]


def test_trace_records_then_follows_and_drops_a_changed_order():
    a, b, c = unit("a", 10), unit("b", 20), unit("c", 30)
    t = Trace()
    assert [t.use(u) for u in (a, b, c)] == [[], [], []]  # recording: nothing to prefetch
    t.end_micro_step()
    assert t.steady and t.use(a) == [b, c] and t.use(b) == [c]
    assert t.reused_within(b, 1) is False and t.reused_within(c, 100) is False  # c not reached yet
    assert t.use(a) == [] and not t.steady  # a where c was expected: the order changed
    t.end_micro_step()
    assert t.recording and t.order == []


def test_reused_within_follows_the_recorded_distances():
    a, b = unit("a", 10), unit("b", 20)
    t = Trace()
    for u in (a, b, b, a):
        t.use(u)
    t.end_micro_step()
    t.use(a)
    assert t.reused_within(a, 41) and not t.reused_within(a, 40) and not t.reused_within(a, 0)  # b twice between


def test_reduce_groups_cut_at_the_bucket_size_and_fill_rows_by_rank():
    us = [unit("a", 4), unit("b", 6), unit("c", 8)]
    groups = reduce_groups(us, bucket_size=10, world_size=2)
    assert [[u.name for u in g.units] for g in groups] == [["a", "b"], ["c"]]
    g = groups[0]
    assert g.put(us[0], torch.tensor([1., 2, 3, 4])) is None  # rank 0's shard [1, 2], rank 1's [3, 4]
    flat = g.put(us[1], torch.tensor([5., 6, 7, 8, 9, 10]))
    assert flat.tolist() == [1, 2, 5, 6, 7, 3, 4, 8, 9, 10]  # row r: every unit's shard r, end to end
    staged = torch.ones(8)
    assert groups[1].put(us[2], staged) is staged  # a group of one reduces its own buffer
