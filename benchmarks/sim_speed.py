"""How fast is the simulator? One step of GPT-3 175B on 1024 A100s (TP 8 × PP 16 × DP 8, 1F1B,
64 micro-batches, ZeRO-1, full recomputation), built and simulated from scratch; target < 1 s.

    python benchmarks/sim_speed.py [--repeat 5]

Prints the best wall time of whole ``sim.simulate`` calls, its parts (graph build, costs, list
scheduling, memory timeline), the graph's size and nodes per second, and checks the built-in
identity: with free communication the same graph takes (m + p − 1)(t_F + t_B).
"""
from __future__ import annotations

import argparse
import time

import sim
from sim.cost import CostModel, layer_forward_flops
from sim.engine import list_schedule
from sim.graph import build_graph
from sim.memory_timeline import memory_timeline, static_bytes


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--granularity", default="auto", help="'auto', 'layer', 'stage' or layers per node")
    args = ap.parse_args(argv)
    gran = int(args.granularity) if args.granularity.isdigit() else args.granularity

    model = sim.Model.preset("gpt3-175b")
    cluster = sim.Cluster.preset("A100-80GB", nodes=128)
    plan = sim.Plan(zero_stage=1, tp=8, pp=16, dp=8, micro_batch_size=1, num_microbatches=64,
                    schedule="1f1b", recompute="full")
    wall, r = best(lambda: sim.simulate(model, cluster, plan, granularity=gran), args.repeat)
    n = len(r.graph)
    edges = sum(len(d) for d in r.graph.deps)

    t_build, graph = best(lambda: build_graph(model, plan, granularity=gran), args.repeat)
    cm = CostModel(cluster, plan, sim.Costs())
    t_cost, durations = best(lambda: cm.durations(graph.works), args.repeat)
    t_sched, (start, end) = best(lambda: list_schedule(graph, durations), args.repeat)
    static = static_bytes(model, plan)
    t_mem, _ = best(lambda: memory_timeline(graph, start, end, static), args.repeat)

    print(f"sim.simulate: GPT-3 175B, 1024 × A100-80GB, TP 8 × PP 16 × DP 8, 1F1B, m = 64, granularity {gran}")
    print(f"  {n} nodes, {edges} edges, {len(graph.mem_node)} memory deltas")
    print(f"  wall time {wall * 1e3:.1f} ms (best of {args.repeat}) = {n / wall / 1e3:.0f} k nodes/s end to end"
          f"  [target < 1000 ms: {'OK' if wall < 1 else 'MISSED'}]")
    print(f"  parts: build {t_build * 1e3:.1f} ms, costs {t_cost * 1e3:.2f} ms, "
          f"list scheduling {t_sched * 1e3:.1f} ms ({n / t_sched / 1e6:.2f} M nodes/s), "
          f"memory timeline {t_mem * 1e3:.1f} ms")
    print(f"  result: {r.summary()}")

    free = sim.simulate(model, cluster, plan, sim.Costs.compute_only(), granularity=gran, head=False)
    rate = cluster.gpu.peak_flops * 0.5
    fwd = model.layers // plan.pp * layer_forward_flops(model, 1) / plan.tp / rate
    want = (plan.num_microbatches + plan.pp - 1) * (fwd + 3 * fwd)  # t_B = 2 t_F + recompute t_F
    assert abs(free.step_time - want) <= 1e-9 * want, (free.step_time, want)
    print(f"  identity: free communication gives (m + p − 1)(t_F + t_B) = {want:.6f} s exactly; "
          f"bubble {free.bubble_fraction:.4f} = (p − 1)/(m + p − 1) = {15 / 79:.4f}")


if __name__ == "__main__":
    main()
