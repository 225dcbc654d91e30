"""Chapter 17's harness: grade a hand-written ring all-reduce on real ranks (its result, its bytes, its peers)."""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from zero_ref import collective_algorithms, comm

_COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "reduce_scatter", "all_gather_into_tensor", "all_gather",
                "reduce", "broadcast", "all_to_all_single", "all_to_all", "gather", "scatter")
_POINT_TO_POINT = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}
_LIBRARY_RINGS = ("ring_all_reduce_", "ring_reduce_scatter_", "ring_all_gather_", "_exchange")


@contextmanager
def point_to_point_only(peers: list):
    """Inside the block torch.distributed's collectives and the library's ring raise (the ring is built here from
    messages), and every point-to-point call appends (kind, peer) to ``peers``."""
    saved = {name: getattr(dist, name) for name in (*_COLLECTIVES, *_POINT_TO_POINT)}
    library = {name: getattr(collective_algorithms, name) for name in _LIBRARY_RINGS}

    def refuse(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"Task 17.1 builds all-reduce from comm.isend / comm.irecv; it called {name}")
        return call

    def watch(name):
        def call(tensor, *args, **kwargs):
            peer = kwargs.get(_POINT_TO_POINT[name], args[0] if args else None)
            peers.append(("send" if "send" in name else "recv", peer))
            return saved[name](tensor, *args, **kwargs)
        return call

    try:
        for name in _COLLECTIVES:
            setattr(dist, name, refuse(name))
        for name in _POINT_TO_POINT:
            setattr(dist, name, watch(name))
        for name in _LIBRARY_RINGS:
            setattr(collective_algorithms, name, refuse(f"collective_algorithms.{name}"))
        yield peers
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
        for name, fn in library.items():
            setattr(collective_algorithms, name, fn)


def grade_ring(rank: int, world: int, ring_fn, sizes) -> dict:
    """For each size: does ``ring_fn`` leave gloo's all-reduce in the buffer (integer values: exact in any
    order), the bytes this rank sent, and the peers it sent to and received from."""
    out = {}
    for numel in sizes:
        mine = (torch.arange(numel, dtype=torch.float32) % 97) * (rank + 1)
        expected = mine.clone()
        comm.all_reduce(expected)
        peers = []
        with point_to_point_only(peers), comm.recording() as log:
            ring_fn(mine)
        out[numel] = dict(equal=torch.equal(mine, expected), sent=log.total_bytes("send"),
                          sends=sorted({p for kind, p in peers if kind == "send"}),
                          recvs=sorted({p for kind, p in peers if kind == "recv"}))
    return out


def compare_fits(sweep) -> dict:
    """One (α, B) for all three collectives fitted twice on a measured sweep — with the algorithms gloo runs
    (reduce-scatter as an all-reduce) and with the ring model the library assumes — and each fit's rms
    relative error."""
    import numpy as np

    from sim.calibration.fit_local import alpha_beta_terms, fit_alpha_beta

    t = np.array([s["seconds"] for s in sweep])
    terms = np.array([alpha_beta_terms("all_reduce" if s["op"] == "reduce_scatter" else s["op"], s["bytes"],
                                       s["group_size"]) for s in sweep]) / t[:, None]
    alpha, inv_bw = np.linalg.lstsq(terms, np.ones(len(t)), rcond=None)[0]
    gloo_errors = terms @ [alpha, inv_bw] - 1
    ring = fit_alpha_beta(sweep)
    ring_errors = np.array([ring.time(s["op"], s["bytes"], s["group_size"]) / s["seconds"] - 1 for s in sweep])
    rms = lambda e: float(np.sqrt(np.mean(e ** 2)))
    return dict(gloo=(float(alpha), float(1 / inv_bw), rms(gloo_errors), float(np.abs(gloo_errors).max())),
                ring=(ring.alpha, ring.bandwidth, rms(ring_errors), float(np.abs(ring_errors).max())))
