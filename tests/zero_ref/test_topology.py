"""The rank grid (zero_ref.parallel.topology) without processes, and process groups built from it on real ranks."""
import itertools

import pytest
from hypothesis import given, settings, strategies as st

import zero_ref
from zero_ref.parallel.topology import AXES, GRID_AXES, Coords, Topology

ORDERS = ["-".join(p) for p in itertools.permutations(GRID_AXES)]


@st.composite
def topologies(draw):
    tp, pp, dp = (draw(st.integers(1, 6)) for _ in range(3))
    ep = draw(st.sampled_from([e for e in range(1, dp + 1) if dp % e == 0]))
    return Topology(tp=tp, pp=pp, dp=dp, order=draw(st.sampled_from(ORDERS)), ep=ep)


@settings(max_examples=200, deadline=None)
@given(topo=topologies())
def test_every_rank_is_in_exactly_one_group_per_axis_and_the_groups_partition_the_world(topo):
    world = list(range(topo.world_size))
    for axis in AXES:
        groups = topo.groups(axis)
        assert sorted(r for g in groups for r in g) == world         # each rank exactly once
        size = {"tp": topo.tp, "dp": topo.dp, "pp": topo.pp, "ep": topo.ep, "edp": topo.dp // topo.ep}[axis]
        assert all(len(g) == size for g in groups) and len(groups) == topo.world_size // size
        for g in groups:
            assert all(topo.group_of(axis, r) == g for r in g)
            assert [topo.coord(axis, r) for r in g] == list(range(size))   # listed by coordinate


@settings(max_examples=200, deadline=None)
@given(topo=topologies())
def test_coords_and_rank_are_inverse_and_groups_vary_one_coordinate(topo):
    for r in range(topo.world_size):
        c = topo.coords(r)
        assert topo.rank(*c) == r
        for axis, letter in zip(GRID_AXES, "tdp"):
            others = [x for x, name in zip(c, "tdp") if name != letter]
            for peer in topo.group_of(axis, r):  # a group differs only in its own coordinate
                pc = topo.coords(peer)
                assert [x for x, name in zip(pc, "tdp") if name != letter] == others
    # the ep groups split each dp group into blocks; edp joins the same position of every block
    for g in topo.groups("dp"):
        assert [r for r in g] == [r for r0 in g[::topo.ep] for r in topo.group_of("ep", r0)]


@settings(max_examples=100, deadline=None)
@given(tp=st.integers(1, 8), pp=st.integers(1, 4), dp=st.integers(1, 4))
def test_the_first_axis_of_the_order_gets_contiguous_ranks(tp, pp, dp):
    for order in ORDERS:
        topo = Topology(tp=tp, pp=pp, dp=dp, order=order)
        first = order.split("-")[0]
        for g in topo.groups(first):
            assert g == list(range(g[0], g[0] + len(g)))
    # default order: a tp group of size ≤ 8 that starts at a multiple of tp stays inside an 8-GPU node
    topo = Topology(tp=tp, pp=pp, dp=dp)
    if 8 % tp == 0:
        assert all(len({topo.node_of(r, 8) for r in g}) == 1 for g in topo.groups("tp"))


def test_the_docstring_example_and_megatrons_formula():
    topo = Topology(tp=2, dp=4, pp=2)
    assert topo.groups("tp")[:2] == [[0, 1], [2, 3]]
    assert topo.groups("dp")[0] == [0, 2, 4, 6] and topo.groups("pp")[0] == [0, 8]
    assert topo.coords(11) == Coords(1, 1, 1)
    for t, d, p in itertools.product(range(2), range(4), range(2)):
        assert topo.rank(t=t, d=d, p=p) == t + 2 * (d + 4 * p)
    across = Topology(tp=2, dp=4, pp=2, order="dp-pp-tp")
    assert across.groups("tp")[0] == [0, 8]
    moe = Topology(dp=8, ep=4)
    assert moe.groups("ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert moe.groups("edp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="order must name each of"):
        Topology(tp=2, order="tp-dp")
    with pytest.raises(ValueError, match="order must name each of"):
        Topology(order="tp-tp-pp")
    with pytest.raises(ValueError, match="tp must be a positive int"):
        Topology(tp=0)
    with pytest.raises(ValueError, match="ep=3 must divide dp=4"):
        Topology(dp=4, ep=3)
    with pytest.raises(ValueError, match="unknown axis 'cp'"):
        Topology(tp=2).groups("cp")
    with pytest.raises(ValueError, match="tp·dp·pp = 2·1·2 = 4 ranks, but the world has 8"):
        Topology(tp=2, pp=2).check_world(8)
    with pytest.raises(ValueError, match="world size 6 is not a multiple of tp·pp = 4·1"):
        Topology.for_world(6, tp=4)
    with pytest.raises(ValueError, match="coordinate d=2 outside 0..1"):
        Topology(dp=2).rank(d=2)
    with pytest.raises(ValueError, match="rank 4 outside a world of 4"):
        Topology(dp=4).coords(4)
    assert Topology.for_world(8, tp=2, pp=2).dp == 2


# ------------------------------------------------------------------ real process groups

LAYOUTS = [Topology(tp=2, dp=2), Topology(tp=2, pp=2, order="pp-tp-dp"), Topology(dp=4, ep=2)]


def sum_over_each_group(rank, world):
    import torch
    from zero_ref import comm
    from zero_ref.parallel.groups import build_groups

    out = []
    for topo in LAYOUTS:  # several topologies live side by side in one process
        pg = build_groups(topo)
        row = {"coords": tuple(pg.coords)}
        for axis in pg.axes:
            x = torch.tensor([float(rank)])
            comm.all_reduce(x, group=pg.group(axis))
            row[axis] = (int(x.item()), pg.ranks(axis), pg.index(axis))
        out.append(row)
    return out


def test_all_reduce_over_each_built_group_sums_exactly_its_ranks():
    results = zero_ref.launch(sum_over_each_group, 4, timeout=240)
    for rank, rows in enumerate(results):
        for topo, row in zip(LAYOUTS, rows):
            assert row["coords"] == tuple(topo.coords(rank))
            axes = ("tp", "dp", "pp") + (("ep", "edp") if topo.ep > 1 else ())
            assert set(row) - {"coords"} == set(axes)
            for axis in axes:
                members = topo.group_of(axis, rank)
                assert row[axis] == (sum(members), members, topo.coord(axis, rank))
