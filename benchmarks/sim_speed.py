"""How fast is the simulator? One step of GPT-3 175B on 1024 A100s (TP 8 × PP 16 × DP 8, 1F1B,
64 micro-batches, ZeRO-1, full recomputation), built and simulated from scratch; target < 1 s.

    python benchmarks/sim_speed.py [--repeat 5] [--simpy-repeat 1]

Prints, best of ``--repeat``:
  (a) whole ``sim.simulate`` calls with both engines (list scheduling; the event heap without
      contention and with its default contention, the shared NIC), their parts, and the built-in
      identity: with free communication the same graph takes (m + p − 1)(t_F + t_B);
  (b) nodes per second of each engine on the same graph against a SimPy formulation of it (one
      process per stream, waiting on its dependencies' events: the same times, checked ==);
  (c) explorer updates (sim.views.widgets: set a control, re-simulate, redraw, encode the PNG) at course
      sizes, wall and CPU time (CPU time is what a loaded machine inflates least); target < 100 ms.
SimPy is a peer measured here only (pip install simpy==4.1.2); sim never imports it.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import sim
from sim.cost.cost_model import CostModel
from sim.cost.flops import layer_forward_flops
from sim.step.event_schedule import Contention, event_schedule
from sim.step.idle import idle_by_cause
from sim.step.list_schedule import list_schedule
from sim.step.lowering import build_graph
from sim.step.memory_timeline import memory_timeline, static_bytes


def best(fn, repeat, clock=time.perf_counter):
    times = []
    for _ in range(repeat):
        t = clock()
        out = fn()
        times.append(clock() - t)
    return min(times), out


def simpy_schedule(graph, durations):
    """The graph in SimPy: a process per (stage, stream) runs its nodes in order, each after its
    dependencies' completion events, for its duration."""
    import simpy

    env, n = simpy.Environment(), len(graph)
    done = [env.event() for _ in range(n)]
    start, end = np.zeros(n), np.zeros(n)
    streams: dict[tuple, list[int]] = {}
    for i in range(n):
        streams.setdefault((graph.stage[i], graph.stream[i]), []).append(i)

    def run(nodes):
        for i in nodes:
            deps = graph.deps[i]
            if deps:
                yield env.all_of([done[d] for d in deps])
            start[i] = env.now
            yield env.timeout(durations[graph.work[i]])
            end[i] = env.now
            done[i].succeed()

    for nodes in streams.values():
        env.process(run(nodes))
    env.run()
    return start, end


def engines(args, model, cluster, plan, gran):
    print(f"(a) sim.simulate: GPT-3 175B, 1024 × A100-80GB, TP 8 × PP 16 × DP 8, 1F1B, m = 64, granularity {gran}")
    rows = {}
    for label, kw in (("list", {}), ("events, no contention", dict(engine="events", contention=Contention())),
                      ("events, shared NIC (default)", dict(engine="events"))):
        wall, r = best(lambda: sim.simulate(model, cluster, plan, granularity=gran, **kw), args.repeat)
        rows[label] = r
        print(f"  {label:30s} {wall * 1e3:7.1f} ms  step {r.step_time:.4f} s  "
              f"[target < 1000 ms: {'OK' if wall < 1 else 'MISSED'}]")
    r = rows["list"]
    assert np.array_equal(r.end, rows["events, no contention"].end)
    n, edges = len(r.graph), sum(len(d) for d in r.graph.deps)
    t_build, graph = best(lambda: build_graph(model, plan, granularity=gran), args.repeat)
    cm = CostModel(cluster, plan, sim.Costs())
    durations = cm.durations(graph.works)
    start, end = list_schedule(graph, durations)
    t_mem, _ = best(lambda: memory_timeline(graph, start, end, static_bytes(model, plan)), args.repeat)
    t_idle, _ = best(lambda: idle_by_cause(graph, start, end, r.step_time), args.repeat)
    print(f"  {n} nodes, {edges} edges, {len(graph.mem_node)} memory deltas; parts: build {t_build * 1e3:.1f} ms, "
          f"memory timeline {t_mem * 1e3:.1f} ms, idle attribution (on demand) {t_idle * 1e3:.1f} ms")
    print(f"  result: {r.summary()}")
    shared = rows["events, shared NIC (default)"]
    print(f"  shared NIC: step {shared.step_time / r.step_time - 1:+.2%}, dp_comm busy on stage 0 "
          f"{r.busy['dp_comm'][0]:.3f} → {shared.busy['dp_comm'][0]:.3f} s")

    free = sim.simulate(model, cluster, plan, sim.Costs.compute_only(), granularity=gran, head=False)
    rate = cluster.gpu.peak_flops * 0.5
    fwd = model.layers // plan.pp * layer_forward_flops(model, 1) / plan.tp / rate
    want = (plan.num_microbatches + plan.pp - 1) * (fwd + 3 * fwd)  # t_B = 2 t_F + recompute t_F
    assert abs(free.step_time - want) <= 1e-9 * want, (free.step_time, want)
    print(f"  identity: free communication gives (m + p − 1)(t_F + t_B) = {want:.6f} s exactly; "
          f"bubble {free.bubble_fraction:.4f} = (p − 1)/(m + p − 1) = {15 / 79:.4f}; fill/drain idle "
          f"{free.idle['fill_drain'].mean() / free.step_time:.4f} of the step")
    return graph, durations, (start, end)


def peers(args, graph, durations, list_times):
    print("(b) the same graph, scheduling only (nodes per second)")
    n = len(graph)
    t_list, _ = best(lambda: list_schedule(graph, durations), args.repeat)
    t_ev, ev = best(lambda: event_schedule(graph, durations), args.repeat)
    shared = Contention((sim.step.event_schedule.SharedLink("ib", ("dp_comm", "pp_comm")),))
    t_sh, _ = best(lambda: event_schedule(graph, durations, shared), args.repeat)
    rows = [("list scheduling (sim.step.list_schedule)", t_list),
            ("event heap, no contention (sim.step.event_schedule)", t_ev),
            ("event heap, shared NIC (sim.step.event_schedule)", t_sh)]
    try:
        import simpy
        t_simpy, sp = best(lambda: simpy_schedule(graph, durations), args.simpy_repeat)
        assert np.array_equal(sp[1], list_times[1]) and np.array_equal(ev[1], list_times[1])
        rows.append((f"SimPy {simpy.__version__} (same times, ==)", t_simpy))
    except ImportError:
        t_simpy = None
        print("  simpy not installed: pip install simpy==4.1.2")
    for label, t in rows:
        ratio = f"  {t_simpy / t:5.1f}× SimPy's rate" if t_simpy else ""
        print(f"  {label:42s} {t * 1e3:8.1f} ms  {n / t / 1e6:6.2f} M nodes/s{ratio}")


def widget_updates(args):
    from sim.views import widgets

    print("(c) explorer update: set a control → simulate → redraw → PNG (best of "
          f"{args.repeat}; wall / CPU ms)  [target < 100 ms]")
    cases = [("gpt3-1.3b, TP 2 × PP 4 × DP 2, ZeRO-1, m 8↔16", dict(model="gpt3-1.3b", tp=2, pp=4, dp=2,
                                                                    zero_stage=1, microbatches=8), "microbatches", 16),
             ("gpt3-13b, TP 8 × PP 4 × DP 4, ZeRO-3, m 8↔16", dict(model="gpt3-13b", tp=8, pp=4, dp=4, zero_stage=3,
                                                                   microbatches=8), "microbatches", 16),
             ("gpt3-175b, TP 8 × PP 16 × DP 8, ZeRO-1, m 64↔32", {}, "microbatches", 32)]
    for label, settings, control, other in cases:
        ex = widgets.explore(**settings)
        first = ex.controls[control].value

        def move():  # every call changes the value, so every call re-simulates and redraws
            c = ex.controls[control]
            c.value = other if c.value == first else first
        wall, _ = best(move, args.repeat)
        cpu, _ = best(move, args.repeat, time.process_time)
        print(f"  {label:48s} {wall * 1e3:6.0f} / {cpu * 1e3:4.0f} ms  ({len(ex.result.graph)} nodes)")
    pe = widgets.pipeline_explorer()
    m = pe.controls["microbatches"]
    move = lambda: setattr(m, "value", 24 - m.value)  # 8 ↔ 16
    wall, _ = best(move, args.repeat)
    cpu, _ = best(move, args.repeat, time.process_time)
    print(f"  {'pipeline_explorer, p 4, m 8↔16':48s} {wall * 1e3:6.0f} / {cpu * 1e3:4.0f} ms")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--simpy-repeat", type=int, default=1)
    ap.add_argument("--granularity", default="auto", help="'auto', 'layer', 'stage' or layers per node")
    ap.add_argument("--no-widgets", action="store_true")
    args = ap.parse_args(argv)
    gran = int(args.granularity) if args.granularity.isdigit() else args.granularity

    model = sim.Model.preset("gpt3-175b")
    cluster = sim.Cluster.preset("A100-80GB", nodes=128)
    plan = sim.Plan(zero_stage=1, tp=8, pp=16, dp=8, micro_batch_size=1, num_microbatches=64,
                    schedule="1f1b", recompute="full")
    graph, durations, times = engines(args, model, cluster, plan, gran)
    peers(args, graph, durations, times)
    if not args.no_widgets:
        widget_updates(args)


if __name__ == "__main__":
    main()
