"""List scheduling: the step's timing in one pass over the task graph.

The graph's nodes are in topological order and each stream runs its nodes in that order, so
without contention the timing is one pass: start = max(the stream is free, every dependency has
ended), end = start + duration. sim.step.event_schedule decides what must be decided at run time
(shared links, ZeRO-3's live-parameter cap, memory pressure) and agrees with this node for node on
contention-free graphs.
"""
from __future__ import annotations

import numpy as np

from sim.step.graph import STREAMS, TaskGraph


def list_schedule(graph: TaskGraph, durations: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Start and end times of every node; ``durations[w]`` is the seconds of work item w."""
    n_streams = len(STREAMS)
    resource = [s * n_streams + st for s, st in zip(graph.stage, graph.stream)]
    dur = [durations[w] for w in graph.work]
    free = [0.0] * (graph.stages * n_streams)
    start, end = [0.0] * len(resource), [0.0] * len(resource)
    deps = graph.deps
    for i, r in enumerate(resource):
        t = free[r]
        for d in deps[i]:
            e = end[d]
            if e > t:
                t = e
        start[i] = t
        free[r] = end[i] = t + dur[i]
    return np.asarray(start), np.asarray(end)
