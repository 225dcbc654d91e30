"""Ring attention and DeepSpeed-Ulysses on real gloo ranks equal single-device causal attention.

Forward output and the gradients of q, k, v, at 2 and 4 ranks, in float64: the blocks' online
softmax adds the same terms in another order, so float64 agrees to ~1e-15 and 1e-12 leaves room
without hiding a wrong mask (a mask error changes outputs at order 0.1). The bytes each rank hands
to ``zero_ref.comm`` equal ``zero_ref.parallel.context``'s formulas exactly.
"""
import pytest
import torch

import zero_ref
from zero_ref.parallel import context
from zero_ref.parallel.attention import causal_attention
from zero_ref.parallel.ring_attention import zigzag_merge, zigzag_split

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

S, B, HEADS, D = 16, 2, 4, 8
TOL = 1e-12


def inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(S, B, HEADS, D, generator=g, dtype=torch.float64) for _ in range(4)]  # q, k, v, dout


def reference():
    q, k, v, dout = inputs()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = causal_attention(q, k, v)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def run(rank, world, kind):
    import torch
    from zero_ref import comm
    from zero_ref.parallel.ring_attention import ring_attention, zigzag_split
    from zero_ref.parallel.ulysses import ulysses_attention

    if kind == "ring":
        shard, attend = (lambda t: zigzag_split(t, world, rank)), ring_attention
    else:
        shard, attend = (lambda t: t.chunk(world)[rank].contiguous()), ulysses_attention
    q, k, v, dout = (shard(t) for t in inputs())
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with comm.recording() as fwd:
        out = attend(q, k, v, None)
    with comm.recording() as bwd:
        out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad, fwd.by_op(), bwd.by_op()


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["ring", "ulysses"])
def test_equals_single_device_attention(kind, world):
    results = zero_ref.launch(run, world, kind, timeout=120, echo=False)
    merge = zigzag_merge if kind == "ring" else torch.cat
    for name, got, want in zip(("out", "dq", "dk", "dv"), zip(*[r[:4] for r in results]), reference()):
        torch.testing.assert_close(merge(list(got)), want, rtol=0, atol=TOL, msg=f"{kind} cp={world}: {name}")
    for r in results:
        fwd, bwd = r[4], r[5]
        if kind == "ring":
            want = context.ring_bytes(B, S, HEADS, D, world, element_size=8)
            assert (fwd["send"]["bytes"], bwd["send"]["bytes"]) == (want["forward"], want["backward"])
            assert (fwd["send"]["calls"], bwd["send"]["calls"]) == (world - 1, 2 * world - 1)
            assert set(fwd) | set(bwd) == {"send", "recv"}
        else:
            want = context.ulysses_bytes(B, S, HEADS, D, world, element_size=8)
            assert (fwd["all_to_all"]["bytes"], bwd["all_to_all"]["bytes"]) == (want["forward"], want["backward"])
            assert fwd["all_to_all"]["calls"] == bwd["all_to_all"]["calls"] == 4
            assert set(fwd) == set(bwd) == {"all_to_all"}


def test_zigzag_split_balances_causal_work():
    # causal work of a token = its position + 1 keys: every rank gets the same total
    for cp in (2, 4, 8):
        work = [sum(p + 1 for p in context.zigzag_positions(64, cp, r)) for r in range(cp)]
        assert len(set(work)) == 1, work
    x = torch.arange(16.0)
    assert torch.equal(zigzag_merge([zigzag_split(x, 4, r) for r in range(4)]), x)
    assert zigzag_split(x, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]


def test_bad_shapes_name_the_numbers():
    with pytest.raises(ValueError, match="heads = 6 .* cp = 4"):
        context.check_ulysses(6, 4)
    with pytest.raises(ValueError, match="kv_heads = 2 .* cp = 4"):
        context.check_ulysses(8, 4, kv_heads=2)
    with pytest.raises(ValueError, match="sequence length 12 .* 2·cp = 8"):
        context.check_zigzag(12, 4)


def with_deepspeed(rank, world):
    """DeepSpeed 0.19.8's DistributedAttention and ulysses_attention on the same shards: (out, dq, dk, dv) each."""
    import os
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    import torch.distributed as dist
    from deepspeed.sequence.layer import DistributedAttention
    from zero_ref.parallel.ulysses import ulysses_attention

    deepspeed.init_distributed(dist_backend="gloo")
    q, k, v, dout = (t.chunk(world)[rank].contiguous() for t in inputs())
    ds = DistributedAttention(causal_attention, dist.group.WORLD)   # scatter heads (2), gather sequence (0)
    runs = []
    for attend in (lambda *t: ds(*t, batch_dim_idx=1), lambda *t: ulysses_attention(*t)):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = attend(qq, kk, vv)
        out.backward(dout)
        runs.append((out.detach(), qq.grad, kk.grad, vv.grad))
    return runs


def test_ulysses_equals_deepspeed_distributed_attention():
    # the same permutations around the same local attention: equal to the bit
    for ds, ours in zero_ref.launch(with_deepspeed, 2, timeout=300, echo=False):
        for name, a, b in zip(("out", "dq", "dk", "dv"), ds, ours):
            assert torch.equal(a, b), name
