"""A search loop run under watch (chapter 29): every ``sim.simulate`` call counted, the library's search refused,
so a check sees how many plans the loop simulated and that it simulated them itself."""
from __future__ import annotations

from contextlib import contextmanager

import sim
from sim.planning import search


@contextmanager
def counted_simulations():
    """Inside the block ``sim.simulate`` appends each plan it simulates to the yielded list and
    ``sim.planning.search.search`` raises; both are restored on leaving."""
    calls, simulate, library = [], sim.simulate, search.search

    def counted(*args, **kwargs):
        calls.append(args[2] if len(args) > 2 else kwargs.get("plan"))
        return simulate(*args, **kwargs)

    def refused(*args, **kwargs):
        raise RuntimeError("the check runs your loop without sim.planning.search: simulate the plans yourself "
                           "with sim.simulate")

    sim.simulate, search.search = counted, refused
    try:
        yield calls
    finally:
        sim.simulate, search.search = simulate, library
