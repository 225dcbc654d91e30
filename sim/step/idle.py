"""Why a GPU's compute stream sits idle: each gap split by what it was waiting for.

Every idle gap on a stage's compute stream ends at the compute node that could not start earlier
(or, for the gap after its last compute, at the end of the step). Walking back from that node
along its *binding* predecessor — the dependency, or the stream's previous node, that ended last —
covers the gap with the spans of the nodes it was waiting on, newest first, and each span is
charged to a cause:

    fill_drain     waiting on another stage's work: the pipeline's fill and drain bubble (and
                   everything that delays the other stages, their imbalance included); also the
                   end of the step after this stage's own last node
    p2p_wait       a pipeline send (activation or gradient) in flight
    exposed_comm   a TP, CP or DP/ZeRO collective on this stage (all-reduce, reduce-scatter, ZeRO-3
                   gather, gradient norm, parameter all-gather) that compute could not hide
    offload_stall  a PCIe copy, NVMe read/write or CPU Adam on this stage
    memory_wait    (event engine) a compute node whose inputs were ready, waiting for memory

A node that started after all its predecessors had ended (a transfer queued on a shared link, a
ZeRO-3 gather held back by the live-parameter cap) is charged for that wait by its own cause. The
walk stops at the gap's start, so the causes of one stage add up to its idle time:
Σ causes = step time − busy compute time (to rounding; tests/sim/test_engine.py checks 1e-12).
"""
from __future__ import annotations

import numpy as np

from sim.step.graph import STREAMS

CAUSES = ("fill_drain", "p2p_wait", "exposed_comm", "offload_stall", "memory_wait")
CAUSE_LABELS = {"fill_drain": "fill/drain", "p2p_wait": "p2p wait", "exposed_comm": "exposed comm",
                "offload_stall": "offload stall", "memory_wait": "memory wait"}
_CAUSE_OF_STREAM = {"tp_comm": "exposed_comm", "dp_comm": "exposed_comm", "cp_comm": "exposed_comm", "pp_comm": "p2p_wait",
                    "h2d": "offload_stall", "d2h": "offload_stall", "nvme": "offload_stall", "cpu": "offload_stall"}


def idle_by_cause(graph, start, end, step: float) -> dict[str, np.ndarray]:
    """{cause: idle seconds per stage} for the compute stream of every stage (see the module docstring)."""
    n, compute = len(graph), STREAMS.index("compute")
    cause_id = {c: k for k, c in enumerate(CAUSES)}
    stream_cause = [cause_id.get(_CAUSE_OF_STREAM.get(s), 0) for s in STREAMS]
    stage, stream = graph.stage, graph.stream
    start, end = [float(x) for x in start], [float(x) for x in end]
    deps = graph.deps
    prev, last = [-1] * n, {}  # the previous node on each node's stream: a predecessor too
    for i in range(n):
        key = stage[i] * len(STREAMS) + stream[i]
        prev[i] = last.get(key, -1)
        last[key] = i
    out = np.zeros((len(CAUSES), graph.stages))
    pp_comm = STREAMS.index("pp_comm")

    def cause(x, s):
        if stage[x] != s and stream[x] != pp_comm:
            return 0  # another stage's work (a send stays a send, whoever's NIC it uses)
        return 4 if stream[x] == compute else stream_cause[stream[x]]

    def walk(x, s, a, t, covered):
        """Charge [a, t) on stage s to the chain of nodes that x waited on; x covers [start, t)
        unless ``covered`` (x is the compute node at the end of the gap)."""
        while True:
            if not covered:
                c = cause(x, s)
                lo = a if c == 0 else max(start[x], a)  # another stage: the rest of the gap is its
                out[c, s] += t - lo
                t = lo
            covered = False
            if t <= a:
                return
            y, ready = -1, 0.0  # the binding predecessor: the one that ended last
            for d in deps[x]:
                if y < 0 or end[d] > ready:
                    y, ready = d, end[d]
            p = prev[x]
            if p >= 0 and (y < 0 or end[p] > ready):
                y, ready = p, end[p]
            if ready < t:  # x started past its inputs: waiting for memory, a link or a cap
                lo = max(ready, a)
                out[cause(x, s), s] += t - lo
                t = lo
                if t <= a:
                    return
            x = y

    by_stage = [[] for _ in range(graph.stages)]
    for i in range(n):
        by_stage[stage[i]].append(i)
    for s, nodes in enumerate(by_stage):
        comp = [i for i in nodes if stream[i] == compute]
        a = 0.0
        for i in comp:
            if start[i] > a:
                walk(i, s, a, start[i], True)
            a = max(a, end[i])
        own_end = max((end[i] for i in nodes), default=0.0)
        if step > own_end and step > a:  # this stage is done: waiting for the others to finish the step
            out[0, s] += step - max(own_end, a)
        if own_end > a:
            walk(max(nodes, key=end.__getitem__), s, a, own_end, False)
    return {c: out[k] for k, c in enumerate(CAUSES)}
