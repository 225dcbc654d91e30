"""The order a micro-step uses units in, which ZeRO-3 prefetches along and releases by.

The first micro-step records the order units are used in (forward and backward). Later micro-steps
follow it: after each use the stage prefetches the units that come next, and a unit the order uses
again soon stays gathered (``max_reuse_distance``). A use that leaves the order drops it; the next
micro-step records again.
"""
from __future__ import annotations


class Trace:
    """The recorded order of unit uses, and where the current micro-step is in it."""

    def __init__(self):
        self.order: list | None = []  # the uses; None once a micro-step left it (recorded again next)
        self.recording = True         # this micro-step records the order
        self.pos = 0                  # uses of this micro-step followed so far
        self.at: dict = {}            # unit -> where its current use is in the order
        self.reuse: list[float] = []  # for each use: elements used before the same unit's next use

    @property
    def steady(self) -> bool:
        """Following a recorded order (it repeats)."""
        return not self.recording and self.order is not None

    def use(self, u) -> list:
        """A use of ``u``: record it, or follow the order. Returns the units the order uses after it
        (nothing while recording or once the order changed)."""
        if self.recording:
            self.order.append(u)
        elif self.order is not None:
            if self.pos < len(self.order) and self.order[self.pos] is u:
                self.at[u] = self.pos
                self.pos += 1
                return self.order[self.pos:]
            self.order = None  # the order changed: stop prefetching, record again next step
        return []

    def reused_within(self, u, distance: int) -> bool:
        """Does the order use ``u`` again before ``distance`` elements of units have been used (DeepSpeed's
        ``__params_to_release``, partitioned_param_coordinator.py)?"""
        if distance <= 0 or not self.steady or u not in self.at:
            return False
        return self.reuse[self.at[u]] < distance

    def end_micro_step(self) -> None:
        if self.order is None:
            self.order, self.recording = [], True
        elif self.recording:
            self.recording, self.reuse = False, reuse_distances(self.order)
        self.pos = 0
        self.at.clear()


def reuse_distances(order: list) -> list[float]:
    """For each use in ``order``: elements (``unit.size``) of the uses between it and the same unit's next use
    (inf: none)."""
    out, nxt, total = [float("inf")] * len(order), {}, 0  # nxt[v]: elements from v's next use to the end
    for i in range(len(order) - 1, -1, -1):
        v = order[i]
        if v in nxt:
            out[i] = total - nxt[v]  # total: elements of the uses after i
        total += v.size
        nxt[v] = total
    return out


def oldest_idle(units: list):
    """The gathered, non-persistent unit not in use that was gathered first (``max_live_parameters`` evicts it),
    or None."""
    idle = [v for v in units if v.unit.full is not None and not v.persistent and v.hold == 0]
    return min(idle, key=lambda v: v.age) if idle else None
