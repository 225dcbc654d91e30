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
from zero_ref import RankError, RankTimeout, forkserver


def is_long_lived_helper(p):
    # multiprocessing's resource tracker and zero_ref's fork server live as long as the parent, by design.
    # (The server's ranks carry its command line too, being its forks: only the server itself is let off.)
    if forkserver._server is not None and p.pid == forkserver._server.pid:
        return True
    try:
        return "resource_tracker" in " ".join(p.cmdline())
    except psutil.Error:
        return True


def no_children_left():
    # Give the OS a moment to reap, then insist that no process we started is still alive.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [p for p in psutil.Process().children(recursive=True)
                 if p.status() != psutil.STATUS_ZOMBIE and not is_long_lived_helper(p)]
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
    # An abort in teardown: SIGABRT after this rank's work is done and returned.
    if rank == 0:
        threading.Thread(target=lambda: (time.sleep(0.5), os.kill(os.getpid(), signal.SIGABRT)), daemon=True).start()
    else:
        time.sleep(1.5)  # keep rank 0 waiting for us, so its abort lands after it returned
    return rank * 10


def test_abort_in_teardown_is_a_failure():
    with pytest.raises(RankError, match="(?s)rank 0 failed.*returned its result, then .* killed by SIGABRT in teardown"):
        zero_ref.launch(abort_after_returning, 2, timeout=60)
    assert no_children_left()


def test_ranks_exit_with_status_0_launch_after_launch(monkeypatch):
    """A rank leaves with os._exit after destroy_process_group: no interpreter finalization for gloo's workers
    to abort in (zero_ref.clean_exit); 10 launches of a backward and its all-reduces, every exit status 0."""
    from zero_ref import launcher
    codes, join = [], launcher._join_finished
    monkeypatch.setattr(launcher, "_join_finished", lambda procs, workdir: (join(procs, workdir),
                                                                            codes.append([p.poll() for p in procs])))
    for _ in range(10):
        assert zero_ref.launch(backward_and_all_reduce, 2, timeout=60, echo=False) == [[1.0, 1.0]] * 2
    assert codes == [[0, 0]] * 10


def backward_and_all_reduce(rank, world_size):
    import torch
    from zero_ref import comm
    model = torch.nn.Linear(3, 2)
    # reduced inside the backward, as DDP and the stages do: the work holds torch's backward context (Python)
    model.bias.register_post_accumulate_grad_hook(lambda p: comm.all_reduce(p.grad))
    model(torch.ones(1, 3)).sum().backward()
    return (model.bias.grad / world_size).tolist()


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


def where_am_i(rank, world_size):
    return {"var": os.environ.get("ZERO_LAB_TEST_VAR"), "cwd": os.getcwd(), "parent": os.getppid(),
            "test": os.environ.get("PYTEST_CURRENT_TEST"), "isa": torch.backends.cpu.get_cpu_capability()}


def test_ranks_see_the_callers_environment_and_directory_at_launch(tmp_path, monkeypatch):
    first = zero_ref.launch(where_am_i, 2, timeout=60)
    assert first[0]["parent"] == first[1]["parent"] != os.getpid()  # forked by the fork server
    assert first[0]["test"] == os.environ["PYTEST_CURRENT_TEST"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZERO_LAB_TEST_VAR", "set after the server started")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # read when torch is imported: needs another server
    second = zero_ref.launch(where_am_i, 2, timeout=60)
    assert all(r["var"] == "set after the server started" and r["cwd"] == str(tmp_path) for r in second)
    assert second[0]["isa"] == "DEFAULT" and second[0]["parent"] != first[0]["parent"]
    monkeypatch.setenv("ZERO_REF_FORK_SERVER", "0")
    assert [r["parent"] for r in zero_ref.launch(where_am_i, 2, timeout=60)] == [os.getpid()] * 2  # fresh interpreters


def test_the_fork_server_exits_with_its_parent():
    import subprocess
    import sys
    script = ("import sys, time, zero_ref; zero_ref.launch(lambda r, w: r, 1, echo=False);"
              "from zero_ref import forkserver; print(forkserver._server.pid, flush=True); time.sleep(300)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server = psutil.Process(int(parent.stdout.readline()))
    parent.kill()  # no clean-up runs in the parent: its end of the request pipe just closes
    parent.wait()
    parent.stdout.close()
    server.wait(10)  # raises psutil.TimeoutExpired if the server outlives its parent


def test_a_server_that_cannot_start_is_a_warning_that_says_why():
    env = {**os.environ, "PYTHONHOME": "/nonexistent"}  # its interpreter dies before importing anything
    with pytest.warns(UserWarning, match="(?s)fresh interpreter: the fork server did not start:.*Python"):
        assert forkserver.server(env) is None
