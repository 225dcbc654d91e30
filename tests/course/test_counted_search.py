"""course.labs.counted_search: the plans a loop simulates are counted, the library's search is refused, both restored."""
import pytest

import sim
from course.labs.counted_search import counted_simulations
from sim.planning import search


def test_counts_simulations_refuses_the_search_and_restores_both():
    model, cluster = sim.Model.preset("gpt2-1.5b"), sim.Cluster.preset("A100-80GB", nodes=1)
    plans = search.enumerate_plans(model, cluster, 16)[:3]
    simulate, library = sim.simulate, search.search
    with counted_simulations() as calls:
        for plan in plans[:2]:
            sim.simulate(model, cluster, plan)
        sim.simulate(model, cluster, plan=plans[2])
        with pytest.raises(RuntimeError, match="sim.planning.search"):
            search.search(model, cluster, 16)
    assert calls == plans
    assert (sim.simulate, search.search) == (simulate, library)


def test_restores_when_the_loop_raises():
    simulate, library = sim.simulate, search.search
    with pytest.raises(ZeroDivisionError):
        with counted_simulations():
            1 / 0
    assert (sim.simulate, search.search) == (simulate, library)
