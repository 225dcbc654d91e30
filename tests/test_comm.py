"""The communication layer: real gloo collectives give the right values and are counted exactly."""
import pytest
import torch
import torch.distributed as dist

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
