"""zero_ref.launch: results in rank order, a failing rank fails fast, a hang times out, nothing is left behind."""
import os
import signal
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

import zero_ref
from zero_ref import RankError, RankTimeout


def is_resource_tracker(p):
    # multiprocessing's own helper for the parent; it lives as long as the parent, by design.
    try:
        return "resource_tracker" in " ".join(p.cmdline())
    except psutil.Error:
        return True


def no_children_left():
    # Give the OS a moment to reap, then insist that no process we started is still alive.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [p for p in psutil.Process().children(recursive=True)
                 if p.status() != psutil.STATUS_ZOMBIE and not is_resource_tracker(p)]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def allreduce_rank(rank, world_size, scale):
    t = torch.tensor([float(rank + 1)]) * scale
    dist.all_reduce(t)
    print(f"sum is {t.item():g}")
    return {"rank": rank, "world": dist.get_world_size(), "sum": t.item(), "env_rank": os.environ["RANK"]}


def test_results_in_rank_order_and_real_collective(capsys):
    out = zero_ref.launch(allreduce_rank, 3, 2.0, timeout=60)
    assert [r["rank"] for r in out] == [0, 1, 2]
    assert all(r["world"] == 3 and r["sum"] == 12.0 for r in out)  # 2·(1+2+3)
    assert [r["env_rank"] for r in out] == ["0", "1", "2"]
    assert capsys.readouterr().out.splitlines() == [f"[rank {r}] sum is 12" for r in range(3)]
    assert no_children_left()


def raising_rank(rank, world_size):
    if rank == 1:
        raise ValueError("bad shard size on purpose")
    dist.barrier()  # rank 0 would wait here forever for rank 1
    return rank


def test_a_raising_rank_fails_fast_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        zero_ref.launch(raising_rank, 2, timeout=120)
    assert time.monotonic() - start < 30  # promptly, long before the 120 s timeout
    assert info.value.rank == 1
    assert "ValueError: bad shard size on purpose" in str(info.value)
    assert "raising_rank" in info.value.details  # the user's frame is in the traceback
    assert no_children_left()


def missing_collective(rank, world_size):
    t = torch.ones(4)
    if rank != 1:  # rank 1 skips the all_reduce the others wait on
        dist.all_reduce(t)
    return rank


def test_a_missing_collective_times_out_naming_the_waiting_ranks():
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        zero_ref.launch(missing_collective, 3, timeout=8)
    elapsed = time.monotonic() - start
    assert 8 <= elapsed < 25
    assert info.value.unfinished == [0, 2] and info.value.finished == [1]
    assert "ranks [0, 2] did not finish within 8 s" in str(info.value)
    assert no_children_left()


def abort_after_returning(rank, world_size):
    # Mimic gloo's abort in teardown: SIGABRT after this rank's work is done and returned.
    if rank == 0:
        threading.Thread(target=lambda: (time.sleep(0.5), os.kill(os.getpid(), signal.SIGABRT)), daemon=True).start()
    else:
        time.sleep(1.5)  # keep rank 0 waiting for us, so its abort lands after it returned
    return rank * 10


def test_abort_in_teardown_keeps_the_result():
    assert zero_ref.launch(abort_after_returning, 2, timeout=60) == [0, 10]
    assert no_children_left()


def abort_before_returning(rank, world_size):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGABRT)
        time.sleep(5)
    return rank


def test_abort_before_returning_is_a_failure():
    with pytest.raises(RankError, match="(?s)rank 1 failed.*killed by SIGABRT"):
        zero_ref.launch(abort_before_returning, 2, timeout=60)
    assert no_children_left()


def grandchild_rank(rank, world_size):
    import subprocess
    subprocess.Popen(["sleep", "300"])  # something the rank started and did not clean up
    raise RuntimeError("leaving a child behind")


def test_ranks_children_are_killed_too():
    with pytest.raises(RankError):
        zero_ref.launch(grandchild_rank, 2, timeout=60)
    assert no_children_left()


def test_notebook_style_lambda_and_closure():
    offset = 5
    assert zero_ref.launch(lambda r, w: r + w + offset, 2, timeout=60) == [7, 8]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_world_size(bad):
    with pytest.raises(ValueError, match="world_size"):
        zero_ref.launch(allreduce_rank, bad, 1.0)
