"""The counts chapter 17 prints for its two hand-written all-reduces, and the gloo routines it names."""
import pytest

import zero_ref
from course.labs.all_reduce_counts import ring_and_tree_counts
from course.labs.gloo_routines import profile_gloo_routines


def _both(rank, world):
    return ring_and_tree_counts(rank, world, (8, 1000)), profile_gloo_routines(world, numel=64)


@pytest.mark.slow
def test_ring_and_tree_equal_gloo_and_the_ring_sends_two_n_minus_one_chunks():
    world = 4
    for rows, routines in zero_ref.launch(_both, world, timeout=120, echo=False):
        for numel, row in rows.items():
            assert row["ring_equal"] and row["tree_equal"]
            assert row["ring_messages"] == 2 * (world - 1)
            assert row["ring_sent"] == 2 * (world - 1) * 4 * numel // world  # 4 bytes per float, n chunks
            assert row["tree_messages"] > 0 and row["tree_sent"] > 0
        assert len(routines) >= 3 and all(name.startswith("gloo:") for name in routines)
