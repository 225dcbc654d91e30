"""A simulated step as a Chrome-trace JSON laid out like torch.profiler's (Kineto) GPU traces.

So it opens in Perfetto / chrome://tracing beside a real trace: times in µs, device work as
``ph:"X"`` with ``cat:"kernel"`` (``gpu_memcpy`` for PCIe copies, ``cpu_op`` for host work),
``pid`` = the global rank standing for its pipeline stage, one ``tid`` per stream, NCCL-style
kernel names with torch's ``record_param_comms`` args (Collective name, dtype, In/Out msg nelems,
Group size, Process Group Name/Ranks), ``gpu_user_annotation`` spans per micro-batch op named like
torch's pipelining actions ("2F5": stage 2, forward, micro-batch 5), flows ``s``→``f`` from each
pipeline send to the op that waits for it, and memory as ``ph:"C"`` counters with one numeric arg
each and one counter name per tier and category ("HBM activation", ..., "HBM total", "host optim")
— ui.perfetto.dev rejects counters with several args.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sim.cost.cost_model import CostModel
from sim.cost.work import Collective, Copy
from sim.spec.topology import group_ranks, rank_of
from sim.step.graph import KINDS, STREAMS, TIERS, node_name

TIER_LABEL = {"gpu": "HBM", "cpu": "host", "nvme": "NVMe"}
_COLLECTIVE = {"all_reduce": ("AllReduce", "allreduce"), "reduce_scatter": ("ReduceScatter", "reduce_scatter"),
               "all_gather": ("AllGather", "allgather"), "all_to_all": ("SendRecv", "all_to_all"),
               "p2p": ("SendRecv", "send")}
_DTYPE = {"fp32": ("f32", "Float", 4), "fp16": ("f16", "Half", 2)}
_HOST = {"cpu_adam", "nvme_read", "nvme_write"}


def _us(seconds: float) -> float:
    return round(float(seconds) * 1e6, 3)


def chrome_trace(result) -> dict:
    """The trace as a dict (see the module docstring); ``write_chrome_trace`` saves it."""
    g, pl, cl = result.graph, result.plan, result.cluster
    cm = CostModel(cl, pl, result.costs)
    short, long, width = _DTYPE.get(pl.precision, ("bf16", "BFloat16", 2))
    tc = pl.tp * pl.cp  # cp sits next to tp: rank = t + tp·(c + cp·(d + dp·p))
    pid = [rank_of(0, 0, s, tc, pl.dp) for s in range(pl.pp)]
    events: list[dict] = []
    for s in range(pl.pp):
        events += [
            {"ph": "M", "name": "process_name", "pid": pid[s], "args": {"name": f"GPU {pid[s]} (sim, stage {s})"}},
            {"ph": "M", "name": "process_labels", "pid": pid[s], "args": {"labels": f"pipeline stage {s}"}},
            {"ph": "M", "name": "process_sort_index", "pid": pid[s], "args": {"sort_index": 5_000_000 + pid[s]}}]
        for t, name in enumerate(STREAMS):
            events += [{"ph": "M", "name": "thread_name", "pid": pid[s], "tid": t + 1,
                        "args": {"name": f"stream {t + 1} {name}"}},
                       {"ph": "M", "name": "thread_sort_index", "pid": pid[s], "tid": t + 1, "args": {"sort_index": t}}]
    spans: dict[tuple, list[float]] = {}
    for i in range(len(g)):
        s, kind, stream = g.stage[i], KINDS[g.kind[i]], STREAMS[g.stream[i]]
        work = g.works[g.work[i]]
        ev = {"ph": "X", "cat": "kernel", "name": node_name(g, i), "pid": pid[s], "tid": g.stream[i] + 1,
              "ts": _us(result.start[i]), "dur": _us(result.end[i] - result.start[i]),
              "args": {"stream": g.stream[i] + 1, "device": pid[s], "sim kind": kind}}
        if isinstance(work, Collective):
            op, amount, axis = work.op, work.nbytes, work.axis
            nccl, coll = _COLLECTIVE[op]
            algo = cm.all_reduce(amount, axis)[1].upper() if op == "all_reduce" else "RING"
            if axis == "cp":
                ranks = [pid[s] + k * pl.tp for k in range(pl.cp)]
            elif op == "p2p":
                ranks = [pid[s], pid[(s + 1) % pl.pp]]
            else:  # the dp group is the dp·cp ranks holding the same parameters
                ranks = group_ranks(axis, pl.tp, pl.dp * pl.cp, pl.pp, p=s,
                                    shard=pl.hpz if axis.startswith("dp_hpz") else pl.shard_group)  # ZeRO++'s
            n, elems = len(ranks), int(amount // width)
            ev["name"] = ("ncclDevKernel_SendRecv" if op == "p2p" else f"ncclDevKernel_AllGather_{algo}_LL"
                          if op == "all_gather" else f"ncclDevKernel_{nccl}_Sum_{short}_{algo}_LL")
            ev["args"].update({
                "Collective name": coll, "dtype": long,
                "In msg nelems": elems // n if op == "all_gather" else elems,
                "Out msg nelems": elems // n if op == "reduce_scatter" else elems,
                "Group size": n, "Process Group Name": axis, "Process Group Ranks": str(ranks),
                "sim name": node_name(g, i), "count": work.count})
        elif isinstance(work, Copy) and work.link in ("h2d", "d2h"):
            ev["cat"] = "gpu_memcpy"
            ev["name"] = "Memcpy HtoD (Pinned -> Device)" if work.link == "h2d" else "Memcpy DtoH (Device -> Pinned)"
            ev["args"].update({"bytes": work.nbytes, "sim name": node_name(g, i)})
        elif kind in _HOST:
            ev["cat"] = "cpu_op"
        events.append(ev)
        if stream == "compute" and g.mb[i] >= 0:
            key = (s, {"forward": "F", "weight_grad": "W"}.get(kind, "B"), g.mb[i], g.chunk[i])
            span = spans.setdefault(key, [result.start[i], result.end[i]])
            span[1] = result.end[i]
    for (s, phase, mb, chunk), (a, b) in spans.items():
        events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"{chunk * pl.pp + s}{phase}{mb}",
                       "pid": pid[s], "tid": STREAMS.index("compute") + 1, "ts": _us(a), "dur": _us(b - a)})
    events += _flows(result, pid) + _counters(result, pid)
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": cl.gpu.name, "totalGlobalMem": int(cl.gpu.hbm_bytes)}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": pl.world_size, "pg_count": 3,
                            "pg_config": [{"pg_name": a, "pg_desc": a, "backend_config": "cuda:nccl",
                                           "pg_size": getattr(pl, a)} for a in ("tp", "dp", "pp")],
                            "nccl_version": "sim"},
        "displayTimeUnit": "ms", "baseTimeNanoseconds": 0, "traceEvents": events,
        "traceName": f"sim: {result.summary()}",
    }


def _flows(result, pid) -> list[dict]:
    """Flow arrows from each pipeline send to the op that waited for it."""
    g, out = result.graph, []
    sends = {KINDS.index("send_fwd"), KINDS.index("send_bwd")}
    for i, deps in enumerate(g.deps):
        for d in deps:
            if g.kind[d] in sends:
                k = len(out) // 2
                out += [{"ph": "s", "id": k, "cat": "pp", "name": "p2p", "pid": pid[g.stage[d]],
                         "tid": g.stream[d] + 1, "ts": _us(result.end[d])},
                        {"ph": "f", "bp": "e", "id": k, "cat": "pp", "name": "p2p", "pid": pid[g.stage[i]],
                         "tid": g.stream[i] + 1, "ts": _us(result.start[i])}]
    return out


def _counters(result, pid) -> list[dict]:
    """One counter per (tier, category) that is ever non-zero, plus the HBM total; emitted on change."""
    out = []
    for s in range(result.memory.stages):
        for tier in TIERS:
            times, curves = result.memory.curve(s, tier)
            for name, values in curves.items():
                if name != "total" and not values.any() or name == "total" and tier != "gpu":
                    continue
                keep = np.ones(len(values), dtype=bool)
                keep[1:] = values[1:] != values[:-1]
                label = f"{TIER_LABEL[tier]} {name}"
                out += [{"ph": "C", "name": label, "pid": pid[s], "ts": _us(t), "args": {label: float(v)}}
                        for t, v in zip(times[keep], values[keep])]
    return out


def write_chrome_trace(result, path) -> Path:
    """Write ``chrome_trace(result)`` to ``path`` (opens in ui.perfetto.dev or chrome://tracing)."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(result)))
    return path
