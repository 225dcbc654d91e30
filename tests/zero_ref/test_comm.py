"""The communication layer: real gloo collectives give the right values and are counted exactly."""
import pytest
import torch

import zero_ref
from zero_ref import comm


def every_op(rank, n):
    out = {}
    with comm.recording() as log:
        t = torch.arange(6, dtype=torch.float32) + rank
        comm.all_reduce(t)
        out["all_reduce"] = t.tolist()
        a = torch.full((2,), float(rank + 1))
        comm.all_reduce(a, op="avg")
        out["avg"] = a.tolist()
        full = torch.arange(2 * n, dtype=torch.float64) * (rank + 1)
        shard = torch.empty(2, dtype=torch.float64)
        comm.reduce_scatter(shard, full)
        out["reduce_scatter"] = shard.tolist()
        gathered = torch.empty(3 * n, dtype=torch.int64)
        comm.all_gather(gathered, torch.full((3,), rank, dtype=torch.int64))
        out["all_gather"] = gathered.tolist()
        b = torch.full((4,), float(rank), dtype=torch.bfloat16)
        comm.broadcast(b, src=n - 1)
        out["broadcast"] = b.float().tolist()
        send = torch.arange(n, dtype=torch.float32) + 10 * rank  # element j goes to rank j
        recv = torch.empty(n)
        comm.all_to_all(recv, send)
        out["all_to_all"] = recv.tolist()
        ring = torch.tensor([float(rank)])
        if rank % 2 == 0 and rank + 1 < n:
            comm.send(ring, dst=rank + 1)
        elif rank % 2 == 1:
            comm.recv(ring, src=rank - 1)
        out["p2p"] = ring.item()
        comm.barrier()
    out["log"] = [(r.op, r.group_size, r.numel, r.bytes, r.dtype) for r in log.records]
    out["wire"] = log.total_wire_bytes()
    with comm.recording() as outer, comm.recording() as inner:
        comm.all_reduce(torch.zeros(8))
    out["nested"] = (outer.total_bytes(), inner.total_bytes())
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_every_op_correct_and_counted(n):
    res = zero_ref.launch(every_op, n, timeout=120)
    base = sum(range(n))
    for rank, out in enumerate(res):
        assert out["all_reduce"] == [n * i + base for i in range(6)]
        assert out["avg"] == [(n + 1) / 2] * 2
        tri = n * (n + 1) // 2  # sum of (rank+1)
        assert out["reduce_scatter"] == [(2 * rank + i) * tri for i in range(2)]
        assert out["all_gather"] == [r for r in range(n) for _ in range(3)]
        assert out["broadcast"] == [float(n - 1)] * 4
        assert out["all_to_all"] == [rank + 10 * j for j in range(n)]
        if rank % 2 == 1:
            assert out["p2p"] == rank - 1
        expected = [("all_reduce", n, 6, 24, "float32"), ("all_reduce", n, 2, 8, "float32"),
                    ("reduce_scatter", n, 2 * n, 16 * n, "float64"), ("all_gather", n, 3 * n, 24 * n, "int64"),
                    ("broadcast", n, 4, 8, "bfloat16"), ("all_to_all", n, n, 4 * n, "float32")]
        if rank % 2 == 0 and rank + 1 < n:
            expected.append(("send", n, 1, 4, "float32"))
        elif rank % 2 == 1:
            expected.append(("recv", n, 1, 4, "float32"))
        expected.append(("barrier", n, 0, 0, ""))
        assert out["log"] == expected
        f = (n - 1) / n
        wire = 2 * f * 24 + 2 * f * 8 + f * 16 * n + f * 24 * n + 8 + f * 4 * n
        wire += 4 if ("send", n, 1, 4, "float32") in expected else 0
        assert out["wire"] == pytest.approx(wire)
        assert out["nested"] == (32, 32)


def bad_shapes(rank, n):
    errors = []
    for call in (lambda: comm.reduce_scatter(torch.empty(3), torch.empty(5)),
                 lambda: comm.all_gather(torch.empty(5), torch.empty(3)),
                 lambda: comm.all_to_all(torch.empty(3), torch.empty(3)),
                 lambda: comm.all_reduce(torch.empty(3), op="mean")):
        try:
            call()
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    # Refused before anything is issued: no record, and the tensor is untouched once later collectives are done.
    t = torch.full((2,), float(rank + 1))
    for call in (lambda: comm.all_reduce(t, op="avg", async_op=True),
                 lambda: comm.reduce_scatter(torch.empty(1), t, op="avg", async_op=True)):
        with comm.recording() as log:
            try:
                call()
                errors.append(None)
            except ValueError as e:
                errors.append((str(e), len(log.records)))
    comm.all_reduce(torch.zeros(1))  # gloo runs a group's collectives in order: any issued before are done
    errors.append(t.tolist())
    return errors


def test_bad_shapes_name_the_problem_without_hanging():
    errors = zero_ref.launch(bad_shapes, 2, timeout=60)[0]
    assert "reduce_scatter" in errors[0] and "world_size 2" in errors[0] and "(5,)" in errors[0]
    assert "all_gather" in errors[1]
    assert "all_to_all" in errors[2] and "divide by world_size 2" in errors[2]
    assert "op must be one of" in errors[3]
    for message, records in errors[4:6]:
        assert "async_op=True" in message and records == 0
    assert errors[6] == [1.0, 1.0]


def test_ring_wire_bytes_theory():
    assert comm.ring_wire_bytes("all_reduce", 1000, 4) == 1500
    assert comm.ring_wire_bytes("reduce_scatter", 1000, 4) + comm.ring_wire_bytes("all_gather", 1000, 4) == 1500
    assert comm.ring_wire_bytes("all_reduce", 1000, 1) == 0
    with pytest.raises(ValueError, match="unknown collective"):
        comm.ring_wire_bytes("gossip", 1, 2)


def deepspeed_style(rank, n):
    """A script written for deepspeed.comm, run on zero_ref.comm (import zero_ref.ds as deepspeed)."""
    import zero_ref.ds as deepspeed
    dc = deepspeed.comm
    out = {"rank": dc.get_rank(), "world": dc.get_world_size(), "local": dc.get_local_rank(),
           "global0": dc.get_global_rank(dc.get_world_group(), 0), "ranks": dc.get_all_ranks_from_group(),
           "initialized": dc.is_initialized()}
    t = torch.full((3,), float(rank + 1))
    dc.all_reduce(t, op=dc.ReduceOp.SUM)
    out["sum"] = t.tolist()
    t = torch.full((3,), float(rank + 1))
    dc.all_reduce(t, dc.ReduceOp.MAX)
    out["max"] = t.tolist()
    parts = [torch.empty(2, 2) for _ in range(n)]
    dc.all_gather(parts, torch.full((2, 2), float(rank)))  # DeepSpeed's list form
    out["gathered"] = [p[0, 0].item() for p in parts]
    flat = torch.empty(2 * n)
    dc.all_gather_into_tensor(flat, torch.full((2,), float(rank)))
    out["into_tensor"] = flat.tolist()
    mine = torch.empty(2, 2)
    dc.reduce_scatter(mine, [torch.full((2, 2), float(10 * r + rank)) for r in range(n)], op=dc.ReduceOp.SUM)
    out["scattered"] = mine.flatten().tolist()  # Σ over ranks q of 10·rank + q
    with comm.recording() as log:
        dc.reduce_scatter_tensor(torch.empty(1), torch.ones(n), op=dc.ReduceOp.AVG)
        try:
            dc.reduce_scatter(torch.empty(4, 2).t(), torch.ones(8 * n))
        except ValueError as e:
            out["noncontiguous"] = str(e)
    out["ops"] = [r.op for r in log.records]  # the refused call was never issued
    return out


def test_deepspeeds_comm_names_work_on_zero_ref():
    n = 2
    for rank, out in enumerate(zero_ref.launch(deepspeed_style, n, timeout=60)):
        assert (out["rank"], out["world"], out["global0"], out["ranks"], out["initialized"]) == (rank, n, 0, [0, 1], True)
        assert out["sum"] == [3.0] * 3 and out["max"] == [2.0] * 3
        assert out["gathered"] == [0.0, 1.0] and out["into_tensor"] == [0.0, 0.0, 1.0, 1.0]
        assert out["scattered"] == [10.0 * rank * n + sum(range(n))] * 4
        assert "must be contiguous" in out["noncontiguous"] and out["ops"] == ["reduce_scatter"]
