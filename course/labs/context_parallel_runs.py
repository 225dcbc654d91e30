"""Context-parallel attention on real ranks against one device (chapter 26): ring attention and Ulysses at
cp = 2 and 4, and the check that runs a student's Ulysses beside zero_ref's. Each returns what a chapter compares:
the largest difference from single-device causal attention (output and dq, dk, dv) and the bytes sent."""
from __future__ import annotations

import torch
import torch.distributed as dist

from zero_ref import comm
from zero_ref.measure import saved_activation_bytes
from zero_ref.parallel.attention import causal_attention
from zero_ref.parallel.ring_attention import ring_attention, zigzag_split
from zero_ref.parallel.ulysses import ulysses_attention


def attention_runs(rank, world, s, b, heads, d):
    """Ring and Ulysses at cp = 2 ({0, 1} and {2, 3}) and cp = 4 on this rank of 4, float64: per (method, cp) the
    error, the bytes autograd saved, the bytes handed to send/all-to-all and the wire bytes, forward and backward;
    and under "one device" the bytes single-device causal attention saves."""
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(s, b, heads, d, generator=g, dtype=torch.float64) for _ in range(4))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    with saved_activation_bytes() as saved:
        ref = causal_attention(*full)
    (ref * dout).sum().backward()   # the gradients of ref.backward(dout), seconds sooner in a fresh rank
    result = {"one device": saved.total}
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]      # every rank creates every group
    for cp, group in ((2, pairs[rank // 2]), (4, dist.group.WORLD)):
        r = dist.get_rank(group)
        for kind, attend in (("ring", ring_attention), ("ulysses", ulysses_attention)):
            shard = (lambda t: zigzag_split(t, cp, r)) if kind == "ring" else (lambda t: t.chunk(cp)[r].contiguous())
            mine = [shard(t).requires_grad_() for t in (q, k, v)]
            with saved_activation_bytes() as saved, comm.recording() as fwd:
                out = attend(*mine, group)
            with comm.recording() as bwd:
                (out * shard(dout)).sum().backward()
            want = [shard(t) for t in (ref.detach(), *(f.grad for f in full))]
            got = [out.detach(), *(m.grad for m in mine)]
            result[kind, cp] = dict(error=max((x - y).abs().max().item() for x, y in zip(got, want)),
                                    saved=saved.total,
                                    handed=[log.total_bytes("send") + log.total_bytes("all_to_all")
                                            for log in (fwd, bwd)],
                                    wire=[log.total_wire_bytes() for log in (fwd, bwd)])
    return result


def ulysses_run(rank, world, ulysses):
    """The student's ``ulysses(q, k, v, group)`` on this rank: its error against single-device causal attention and
    against zero_ref's ulysses_attention, its all-to-all bytes (forward, backward), and how it refuses 5 heads."""
    g = torch.Generator().manual_seed(2)
    q, k, v, dout = (torch.randn(32, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(4))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    out = causal_attention(*full)
    (out * dout).sum().backward()     # the gradients of out.backward(dout), seconds sooner in a fresh rank
    shard = lambda t: t.chunk(world)[rank].contiguous()          # rank r: tokens [r·s/cp, (r+1)·s/cp)

    def run(attend):
        mine = [shard(t).requires_grad_() for t in (q, k, v)]
        with comm.recording() as fwd:
            y = attend(*mine, dist.group.WORLD)
        with comm.recording() as bwd:
            (y * shard(dout)).sum().backward()
        return [y.detach(), *(m.grad for m in mine)], [int(log.total_bytes("all_to_all")) for log in (fwd, bwd)]

    yours, sent = run(ulysses)
    theirs, _ = run(ulysses_attention)
    error = lambda got, want: max((a - b).abs().max().item() if a is not None else float("inf")
                                  for a, b in zip(got, want))
    single = [shard(t) for t in (out.detach(), *(f.grad for f in full))]
    try:                                                          # 5 heads: no even split over 2 or 4 ranks
        ulysses(*(torch.randn(8 // world, 1, 5, 8, dtype=torch.float64) for _ in range(3)), dist.group.WORLD)
        refused = "no error"
    except ValueError as e:
        refused = "ValueError naming heads and cp" if "5" in str(e) and str(world) in str(e) else f"ValueError: {e}"
    except Exception as e:
        refused = type(e).__name__
    return dict(single=error(yours, single), zero_ref=error(yours, theirs), sent=sent, refused=refused)
