"""Partition / padding / flatten round-trips (property tests) and the flat Adam step."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from zero_ref.stages.flat import FlatLayout
from zero_ref.optim import AdamConfig, adam_step_

shapes = st.lists(st.lists(st.integers(1, 7), min_size=0, max_size=3).map(tuple), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(shapes=shapes, world=st.integers(1, 8), align=st.sampled_from([1, 2, 4]))
def test_flatten_shard_gather_round_trip(shapes, world, align):
    layout = FlatLayout(shapes, world, align)
    tensors = [torch.randn(s) for s in shapes]
    flat = layout.flatten(tensors)
    assert layout.padded_numel % world == 0 and layout.shard_numel % align == 0
    assert 0 <= layout.padding < world * align or layout.numel == 0
    assert flat[layout.numel:].eq(0).all()
    # Shards tile the buffer; concatenating them (an all-gather) gives it back.
    assert torch.equal(torch.cat([layout.shard(flat, r) for r in range(world)]), flat)
    for t, v in zip(tensors, layout.unflatten(flat)):
        assert torch.equal(t, v)
    # Every real element is owned by exactly one rank, and pieces say where.
    owned = torch.zeros(layout.numel, dtype=torch.int64)
    for r in range(world):
        shard = layout.shard(flat, r)
        for piece in layout.pieces(r):
            src = tensors[piece.index].reshape(-1)[piece.param_start:piece.param_end]
            assert torch.equal(shard[piece.shard_start:piece.shard_start + piece.numel], src)
            owned[layout.offsets[piece.index] + piece.param_start:layout.offsets[piece.index] + piece.param_end] += 1
    assert owned.eq(1).all()


def test_views_share_storage_and_errors_are_clear():
    layout = FlatLayout([(3, 2), (5,)], world_size=4)
    assert (layout.numel, layout.padded_numel, layout.shard_numel) == (11, 12, 3)
    flat = layout.flatten([torch.ones(3, 2), torch.ones(5)])
    layout.unflatten(flat)[1].fill_(7)
    assert flat[6:11].eq(7).all()
    assert "11 elements + 1 padding = 4 × 3" in repr(layout)
    with pytest.raises(ValueError, match="shape \\(2, 3\\) where the layout has \\(3, 2\\)"):
        layout.flatten([torch.ones(2, 3), torch.ones(5)])
    with pytest.raises(ValueError, match="rank 4 is outside world_size 4"):
        layout.shard_range(4)
    with pytest.raises(ValueError, match="world_size"):
        FlatLayout([(2,)], 0)


@pytest.mark.parametrize("adamw,wd", [(True, 0.1), (False, 0.1), (True, 0.0)])
def test_flat_adam_equals_torch_bit_for_bit(adamw, wd):
    torch.manual_seed(0)
    params = [torch.randn(5, 3), torch.randn(7)]
    ref = [p.clone().requires_grad_() for p in params]
    opt = (torch.optim.AdamW if adamw else torch.optim.Adam)(ref, lr=1e-2, weight_decay=wd, foreach=False)
    layout = FlatLayout([p.shape for p in params], world_size=3)
    flat = layout.flatten(params)
    m, v = torch.zeros_like(flat), torch.zeros_like(flat)
    cfg = AdamConfig(lr=1e-2, weight_decay=wd, adamw=adamw)
    for step in range(1, 6):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(ref, grads):
            p.grad = g.clone()
        opt.step()
        # Step each rank's shard separately, as ZeRO does.
        g = layout.flatten(grads)
        for r in range(3):
            adam_step_(layout.shard(flat, r), layout.shard(g, r), layout.shard(m, r), layout.shard(v, r), step, cfg)
    for p, mine in zip(ref, layout.unflatten(flat)):
        assert torch.equal(p.detach(), mine)


def test_bad_hyper_parameters():
    with pytest.raises(ValueError, match="betas\\[1\\]"):
        AdamConfig(betas=(0.9, 1.0))


def test_chunked_step_is_bit_identical(monkeypatch):
    import zero_ref.optim as optim
    torch.manual_seed(1)
    p, g = torch.randn(1000), torch.randn(1000)
    states = [(p.clone(), torch.zeros(1000), torch.zeros(1000)) for _ in range(2)]
    cfg = AdamConfig(lr=1e-2, weight_decay=0.1)
    adam_step_(states[0][0], g, states[0][1], states[0][2], 1, cfg)
    monkeypatch.setattr(optim, "CHUNK", 64)  # 16 chunks, the last one short
    adam_step_(states[1][0], g, states[1][1], states[1][2], 1, cfg)
    assert all(torch.equal(a, b) for a, b in zip(states[0], states[1]))
