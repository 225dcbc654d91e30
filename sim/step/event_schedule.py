"""The event-heap engine: what list scheduling cannot decide ahead of time.

``sim.step.list_schedule.list_schedule`` times a graph in one pass because nothing is decided at run time:
each stream runs its nodes in creation order, each node as soon as its stream is free and its
inputs have ended. This engine keeps that rule and adds three run-time decisions (``Contention``):

* **Shared links** (``SharedLink``): the transfers of several streams of one stage cross one link,
  e.g. the DP reduce-scatter (dp_comm) and the pipeline send (pp_comm) on the same InfiniBand NIC.
  A transfer's duration from the cost model is its *work*: the seconds it takes alone.
  ``policy='fair'`` (the default) splits the link evenly, as flows on one NIC roughly do: with k
  transfers in flight each progresses at 1/k, so two equal transfers started together both end at
  2× their solo time. ``policy='fifo'`` lets one transfer use the whole link at a time, in the order
  they became ready (node index breaks ties): the first ends at 1×, the second at 2×. Transfers of
  zero duration take no bandwidth.
* **Memory caps** (``MemoryCap``): a node whose start-time allocations would push a stage's bytes
  on ``tier`` (optionally only some categories, static model states included) above ``capacity``
  waits until frees make room, blocking its stream (as a CUDA stream waits on the caching
  allocator). Memory is granted in the order it was asked for — at one instant the compute
  stream first — and a request that does not fit holds back those behind it, so a ZeRO-3
  prefetch waits rather than take what the compute it runs ahead of needs. With the category
  'zero3_gathered' this is ZeRO-3's ``stage3_max_live_parameters``: how many gathered parameters
  may be live, so how far the prefetch may run ahead (the graph prefetches one group ahead, so a cap
  can only tighten it). A node that can never fit raises ``DoesNotFit``.

Without contention every node starts at the same time as in list scheduling, bit for bit: it
starts at the time of the event that met its last condition, which is the maximum of the same
end times list scheduling takes (tests/sim/test_events.py checks == on every node).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from zero_ref.memory import recipe
from sim.cost.cost_model import CostModel
from sim.step.graph import CATEGORIES, STREAMS, TIERS, TaskGraph, node_name


_COMPUTE = STREAMS.index("compute")


class DoesNotFit(RuntimeError):
    """A node waits for memory that no remaining node will free."""


@dataclass(frozen=True)
class SharedLink:
    """The streams (of each stage) whose transfers share one link's bandwidth; 'fair' or 'fifo'."""

    name: str
    streams: tuple[str, ...]
    policy: str = "fair"

    def __post_init__(self):
        bad = [s for s in self.streams if s not in STREAMS]
        if bad or len(self.streams) < 2:
            raise ValueError(f"SharedLink {self.name!r}: streams must be two or more of {', '.join(STREAMS)}, "
                             f"got {self.streams!r}")
        if self.policy not in ("fair", "fifo"):
            raise ValueError(f"SharedLink {self.name!r}: policy must be 'fair' or 'fifo', got {self.policy!r}")


@dataclass(frozen=True)
class MemoryCap:
    """At most ``capacity`` bytes on ``tier`` per stage, counting ``categories`` (None: all)."""

    capacity: float
    tier: str = "gpu"
    categories: tuple[str, ...] | None = None

    def __post_init__(self):
        if not self.capacity > 0:
            raise ValueError(f"MemoryCap.capacity must be > 0 bytes, got {self.capacity!r}")
        if self.tier not in TIERS:
            raise ValueError(f"MemoryCap.tier must be one of {', '.join(TIERS)}, got {self.tier!r}")
        bad = [c for c in self.categories or () if c not in CATEGORIES]
        if bad:
            raise ValueError(f"MemoryCap.categories must be among {', '.join(CATEGORIES)}, got {bad!r}")


@dataclass(frozen=True)
class Contention:
    """What the event engine decides at run time: shared ``links`` and memory ``caps``."""

    links: tuple[SharedLink, ...] = ()
    caps: tuple[MemoryCap, ...] = ()

    def __post_init__(self):
        seen = [s for link in self.links for s in link.streams]
        if len(seen) != len(set(seen)):
            raise ValueError(f"a stream may belong to one SharedLink only, got {seen!r}")

    @classmethod
    def for_plan(cls, cluster, plan, costs=None, *, share_ib: bool = True, pcie: str | None = None,
                 policy: str = "fair", max_live_params: float | None = None, hbm: bool = False) -> "Contention":
        """The contention of ``plan`` on ``cluster``.

        ``share_ib``: the streams whose groups cross nodes (DP, the pipeline neighbours, CP)
        share the NIC. ``pcie``: None (H2D and D2H each have a
        direction of the full-duplex link), or 'fair'/'fifo' to make them share one.
        ``max_live_params``: ZeRO-3's stage3_max_live_parameters (elements per rank).
        ``hbm``: cap every stage at the GPU's memory (a plan that does not fit raises DoesNotFit).
        """
        cm = CostModel(cluster, plan, costs)
        links = []
        degrees = {"dp_comm": ("dp", plan.dp * plan.cp), "pp_comm": ("pp", plan.pp), "cp_comm": ("cp", plan.cp)}
        on_ib = tuple(st for st, (axis, n) in degrees.items() if n > 1 and cm.links[axis].kind == "ib")
        if share_ib and len(on_ib) > 1:
            links.append(SharedLink("ib", on_ib, policy))
        if pcie is not None:
            links.append(SharedLink("pcie", ("h2d", "d2h"), pcie))
        caps = []
        if max_live_params is not None:
            caps.append(MemoryCap(max_live_params * recipe(plan.precision).bytes_per_param("params"),
                                  categories=("zero3_gathered",)))
        if hbm:
            caps.append(MemoryCap(cluster.gpu.hbm_bytes))
        return cls(tuple(links), tuple(caps))


def event_schedule(graph: TaskGraph, durations, contention: Contention | None = None,
                   static: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every node, like ``list_schedule`` but deciding contention at run time.

    ``static``: bytes held from the start, ``static[tier][category]`` (sim.step.memory_timeline.static_bytes),
    counted against memory caps.
    """
    return _Run(graph, durations, contention or Contention(), static).run()


class _Run:
    def __init__(self, g, durations, contention, static):
        n, ns = len(g), len(STREAMS)
        self.g, self.n = g, n
        self.dur = [durations[w] for w in g.work]
        self.start, self.end = [0.0] * n, [-1.0] * n
        self.heap: list = []  # (time, node, version): a node's end; stale versions are skipped
        # conditions per node: each dependency (duplicates counted) + the stream's previous node
        self.pending = [len(d) for d in g.deps]
        self.succ: list[list[int]] = [[] for _ in range(n)]
        for i, deps in enumerate(g.deps):
            for d in deps:
                self.succ[d].append(i)
        last: dict[int, int] = {}
        for i in range(n):
            r = g.stage[i] * ns + g.stream[i]
            if r in last:
                self.succ[last[r]].append(i)
                self.pending[i] += 1
            last[r] = i
        # shared links: link index per stream; one instance per (stage, link)
        self.link_of = [-1] * ns
        for k, link in enumerate(contention.links):
            for s in link.streams:
                self.link_of[STREAMS.index(s)] = k
        self.fair = [link.policy == "fair" for link in contention.links]
        self.active: dict[tuple, dict[int, float]] = {}   # fair: node -> remaining solo seconds
        self.last_t: dict[tuple, float] = {}
        self.busy: dict[tuple, bool] = {}                  # fifo: link in use
        self.queue: dict[tuple, list] = {}                 # fifo: (ready, node) heap
        self.version = [0] * n
        self._caps(g, contention.caps, static)
        # the common case, handled inline: no memory to ask for and no shared link to join or leave
        on_link = [self.link_of[st] >= 0 and d > 0 for st, d in zip(g.stream, self.dur)]
        self.plain = [not (on_link[i] or i in self.need) for i in range(n)]
        self.plain_end = [not (on_link[i] or i in self.release) for i in range(n)]

    def _caps(self, g, caps, static):
        """Per node and cap: net bytes at start and at end; per stage and cap: live bytes."""
        self.caps, self.dirty = caps, set()
        self.need: dict[int, list] = {}
        self.release: dict[int, list] = {}
        if not caps:
            return
        cats = [None if c.categories is None else {CATEGORIES.index(x) for x in c.categories} for c in caps]
        tiers = [TIERS.index(c.tier) for c in caps]
        for node, at_end, cat, tier, nbytes in zip(g.mem_node, g.mem_at_end, g.mem_cat, g.mem_tier, g.mem_bytes):
            for k in range(len(caps)):
                if tier == tiers[k] and (cats[k] is None or cat in cats[k]):
                    table = self.release if at_end else self.need
                    table.setdefault(node, [0.0] * len(caps))[k] += nbytes
        base = [sum((static or {}).get(c.tier, {}).get(x, 0.0) for x in (c.categories or CATEGORIES)) for c in caps]
        self.live = [list(base) for _ in range(g.stages)]
        self.waiting: list[list] = [[] for _ in range(g.stages)]   # (ready, not compute, node) heap per stage

    def run(self):
        for i in range(self.n):
            if self.pending[i] == 0:
                self.try_start(i, 0.0)
        self.grant(0.0)
        heap, version, pending, succ, dur = self.heap, self.version, self.pending, self.succ, self.dur
        start, end, plain, plain_end, dirty = self.start, self.end, self.plain, self.plain_end, self.dirty
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            t, i, ver = pop(heap)
            if ver == version[i]:  # else a transfer rescheduled when its link's sharing changed
                end[i] = t
                if not plain_end[i]:
                    self.release_at_end(i, t)
                for j in succ[i]:
                    pending[j] -= 1
                    if not pending[j]:
                        if plain[j]:  # start now: t is the latest end among its conditions
                            start[j] = t
                            push(heap, (t + dur[j], j, 0))
                        else:
                            self.try_start(j, t)
            if dirty and (not heap or heap[0][0] > t):  # every event of this instant is in
                self.grant(t)
        if any(e < 0 for e in self.end):
            self.deadlock()
        return np.asarray(self.start), np.asarray(self.end)

    def push(self, t, i):
        heapq.heappush(self.heap, (t, i, self.version[i]))

    def try_start(self, i, t):
        if i in self.need:  # memory is granted once the instant's frees and requests are all in
            s = self.g.stage[i]
            heapq.heappush(self.waiting[s], (t, self.g.stream[i] != _COMPUTE, i))
            self.dirty.add(s)
            return
        self.admit(i, t)

    def fits(self, i):
        live, cap = self.live[self.g.stage[i]], self.caps
        return all(b <= 0 or live[k] + b <= cap[k].capacity for k, b in enumerate(self.need[i]))

    def admit(self, i, t):
        """Take the memory (if any) and start now, or join/queue on a shared link."""
        if i in self.need:
            live = self.live[self.g.stage[i]]
            for k, b in enumerate(self.need[i]):
                live[k] += b
            if any(b < 0 for b in self.need[i]):
                self.dirty.add(self.g.stage[i])
        k, d = self.link_of[self.g.stream[i]], self.dur[i]
        if k < 0 or d == 0:
            self.start[i] = t
            self.push(t + d, i)
        elif self.fair[k]:
            self.start[i] = t
            self.share((self.g.stage[i], k), t, join=i)
        else:
            key = (self.g.stage[i], k)
            heapq.heappush(self.queue.setdefault(key, []), (t, i))
            if not self.busy.get(key):
                self.next_fifo(key, t)

    def share(self, key, t, join=None, leave=None):
        """Processor sharing: advance everyone in flight at the old rate, then reschedule at the new."""
        active = self.active.setdefault(key, {})
        if active:
            elapsed = (t - self.last_t[key]) / len(active)
            for j in active:
                active[j] -= elapsed
        if leave is not None:
            del active[leave]
        if join is not None:
            active[join] = self.dur[join]
        self.last_t[key] = t
        k = len(active)
        for j, rem in active.items():
            self.version[j] += 1
            self.push(t + max(rem, 0.0) * k, j)

    def next_fifo(self, key, t):
        q = self.queue.get(key)
        self.busy[key] = bool(q)
        if q:
            _, i = heapq.heappop(q)
            self.start[i] = t
            self.push(t + self.dur[i], i)

    def release_at_end(self, i, t):
        """A transfer leaves its link; memory freed at the node's end."""
        g = self.g
        k = self.link_of[g.stream[i]]
        if k >= 0 and self.dur[i] > 0:
            key = (g.stage[i], k)
            if self.fair[k]:
                self.share(key, t, leave=i)
            else:
                self.next_fifo(key, t)
        if i in self.release:
            live = self.live[g.stage[i]]
            for k2, b in enumerate(self.release[i]):
                live[k2] += b
            self.dirty.add(g.stage[i])

    def grant(self, t):
        """Memory in the order it was asked for (at one instant, the compute stream first); a
        request that does not fit holds back those behind it, so a prefetch never takes what the
        compute it runs ahead of needs."""
        while self.dirty:
            s = self.dirty.pop()
            waiting = self.waiting[s]
            while waiting and self.fits(waiting[0][2]):
                self.admit(heapq.heappop(waiting)[2], t)

    def deadlock(self):
        for s, waiting in enumerate(self.waiting if self.caps else []):
            if waiting:
                i = waiting[0][2]
                k = next(k for k, b in enumerate(self.need[i]) if b > 0 and
                         self.live[s][k] + b > self.caps[k].capacity)
                cap, gib = self.caps[k], 2**30
                raise DoesNotFit(
                    f"stage {s}: {node_name(self.g, i)!r} needs {self.need[i][k] / gib:.3g} GiB more on {cap.tier}"
                    f"{'' if cap.categories is None else ' (' + ', '.join(cap.categories) + ')'} with "
                    f"{self.live[s][k] / gib:.3g} of {cap.capacity / gib:.3g} GiB held, and nothing left to free it")
        raise RuntimeError("event engine stopped with unfinished nodes (a dependency cycle?)")
