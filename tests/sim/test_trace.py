"""sim.views.trace: the Chrome-trace JSON follows torch.profiler's layout and Perfetto's counter rule."""
import json
from collections import defaultdict

import sim
from sim.step.graph import STREAMS


def result():
    plan = sim.Plan(zero_stage=3, tp=2, pp=2, dp=2, num_microbatches=4, offload_optimizer="cpu")
    return sim.simulate(sim.Model.preset("gpt3-125m"), sim.Cluster.preset("A100-80GB"), plan)


def test_trace_layout(tmp_path):
    r = result()
    path = sim.write_chrome_trace(r, tmp_path / "rank0.sim.pt.trace.json")
    trace = json.loads(path.read_text())
    assert {"schemaVersion", "deviceProperties", "distributedInfo", "displayTimeUnit", "traceEvents",
            "traceName"} <= set(trace)
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} <= {"X", "M", "C", "s", "f"}
    kernels = [e for e in events if e["ph"] == "X" and e["cat"] != "gpu_user_annotation"]
    assert len(kernels) == len(r.graph)  # every task is one event
    assert {e["pid"] for e in kernels} == {0, 4}  # stage s is global rank s·tp·dp
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in kernels)
    # one tid per stream; the tasks of one track never partially overlap (Perfetto nests X per track)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert sorted({n.split()[-1] for n in names.values()}) == sorted(STREAMS)
    tracks = defaultdict(list)
    for e in kernels:
        tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:]))


def test_nccl_kernels_carry_torch_comm_args():
    events = sim.chrome_trace(result())["traceEvents"]
    nccl = [e for e in events if e["ph"] == "X" and e["name"].startswith("ncclDevKernel_")]
    assert {e["args"]["Collective name"] for e in nccl} == {"allreduce", "allgather", "reduce_scatter", "send"}
    for e in nccl:
        args = e["args"]
        assert {"dtype", "In msg nelems", "Out msg nelems", "Group size", "Process Group Name",
                "Process Group Ranks"} <= set(args)
        if args["Collective name"] == "allgather":
            assert e["name"] == "ncclDevKernel_AllGather_RING_LL"
            assert args["Out msg nelems"] == args["In msg nelems"] * args["Group size"] or \
                args["Out msg nelems"] // args["Group size"] == args["In msg nelems"]
    assert any(e["name"].startswith("ncclDevKernel_ReduceScatter_Sum_bf16_RING") for e in nccl)
    memcpy = {e["name"] for e in events if e.get("cat") == "gpu_memcpy"}
    assert memcpy == {"Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pinned)"}


def test_annotations_flows_and_one_arg_counters():
    events = sim.chrome_trace(result())["traceEvents"]
    annotations = {e["name"] for e in events if e.get("cat") == "gpu_user_annotation"}
    assert annotations == {f"{s}{k}{mb}" for s in (0, 1) for k in "FB" for mb in range(4)}  # torch's "1F3"
    starts = [e for e in events if e["ph"] == "s"]
    assert len(starts) == len([e for e in events if e["ph"] == "f"]) == 2 * 4  # F sends 0→1, B sends 1→0
    counters = [e for e in events if e["ph"] == "C"]
    assert all(len(e["args"]) == 1 and isinstance(next(iter(e["args"].values())), float) for e in counters)
    names = {e["name"] for e in counters}
    assert {"HBM param", "HBM activation", "HBM zero3_gathered", "HBM comm_bucket", "HBM total",
            "host optim", "host grad"} <= names
