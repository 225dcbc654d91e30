"""Fault tolerance under torchrun: a rank killed in the middle of a checkpoint write is restarted with its
peer, resumes from the latest committed checkpoint and ends with the weights of an uninterrupted run, bit
for bit; two torchrun "nodes" (c10d rendezvous over loopback) run the same lab to completion."""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zero_ref.checkpoint.format import get_fp32_state_dict_from_zero_checkpoint

from tests.helpers import free_port

from tests.helpers import ROOT
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
LAB = ["-m", "course.labs.elastic", "--steps", "8", "--save-every", "2"]
pytestmark = pytest.mark.slow  # torchrun jobs
TIMEOUT = 240  # s, generous for a loaded 2-core machine; an idle one needs ~10 s per run


def run_all(commands: list[list[str]], env_extra: dict | None = None) -> list[subprocess.CompletedProcess]:
    """Run the commands concurrently; on timeout kill each one's whole process group (torchrun and its workers)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for c in commands]
    out = []
    try:
        for p, c in zip(procs, commands):
            stdout, stderr = p.communicate(timeout=TIMEOUT)
            out.append(subprocess.CompletedProcess(c, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return out


def lines(stdout: str) -> list[str]:
    return [x for x in stdout.splitlines() if x.startswith("attempt ")]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two torchrun processes, one worker each, meeting through a c10d rendezvous on 127.0.0.1."""
    ckpt = str(tmp_path_factory.mktemp("two_nodes") / "ckpt")
    port = free_port()
    node = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "zero-lab", "--rdzv-conf", "join_timeout=120"]
    runs = run_all([node + ["--node-rank", str(n)] + LAB + ["--checkpoint-dir", ckpt] for n in (0, 1)])
    return ckpt, runs


def test_two_nodes_over_c10d_rendezvous_run_the_lab(two_nodes):
    ckpt, runs = two_nodes
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    said = [x for r in runs for x in lines(r.stdout)]  # rank 0 speaks; either node may host it
    assert said[0] == "attempt 0: 2 ranks, no checkpoint: starting at step 0"
    assert re.fullmatch(r"attempt 0: done at step 8; weights sha256 [0-9a-f]{16}", said[-1])
    assert sorted(os.listdir(ckpt)) == ["final", *[f"global_step{s}" for s in (2, 4, 6, 8)], "latest"]


def test_rank_killed_mid_save_restarts_and_ends_bit_identical(two_nodes, tmp_path):
    # Rank 1 dies half-way through writing its shard of checkpoint 6: that checkpoint is never committed,
    # torchrun restarts both workers, and they resume from checkpoint 4.
    ckpt = str(tmp_path / "ckpt")
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1"] + LAB + \
        ["--checkpoint-dir", ckpt, "--kill-at-step", "6", "--kill-during-save"]
    run, = run_all([cmd], {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    said = lines(run.stdout)
    assert said[:3] == ["attempt 0: 2 ranks, no checkpoint: starting at step 0",
                        "attempt 0: step 2: saved ckpt/global_step2", "attempt 0: step 4: saved ckpt/global_step4"]
    assert said[3:6] == ["attempt 0: rank 1 is killed (SIGKILL) while writing optim_states_rank001.pt",
                         "attempt 1: found an unfinished save, .global_step6.tmp-<nonce>",
                         "attempt 1: 2 ranks, resumed from global_step4 at step 4"]
    uninterrupted = lines(two_nodes[1][0].stdout + two_nodes[1][1].stdout)[-1]
    assert said[-1] == uninterrupted.replace("attempt 0", "attempt 1")
    a = get_fp32_state_dict_from_zero_checkpoint(ckpt, tag="final")
    b = get_fp32_state_dict_from_zero_checkpoint(two_nodes[0], tag="final")
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert not any(".tmp-" in n for n in os.listdir(ckpt))  # the restarted run's first save removed it
