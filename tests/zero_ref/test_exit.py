"""A finished run exits with status 0: zero_ref.clean_exit waits at exit until gloo's workers are idle, so
none of them is still dropping a finished work (which takes the GIL) when Python finalizes."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import zero_ref
from tests.helpers import ROOT, torchrun_env

pytestmark = pytest.mark.slow  # real multi-rank jobs

# tests/zero_ref/test_clients.py's pipeline config (ZeRO-1, 2 stages, 4 micro-batches a step)
PIPELINE = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4, "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
            "zero_optimization": {"stage": 1}, "steps_per_print": 100}
RUNS = 3  # measured on 2 CPU ranks: without zero_ref.clean_exit 7 of 20 runs aborted at exit, with it 0 of 40


def workers_around_a_collective(rank, world):
    from zero_ref import clean_exit, comm

    t = torch.full((3,), float(rank))
    comm.all_reduce(t)
    settled = clean_exit.drain(timeout=5.0)
    idle = not clean_exit.busy_workers()
    if rank == 0:  # a collective the peer joins 2 s later: its worker stays busy meanwhile
        work = torch.distributed.all_reduce(t, async_op=True)
        in_flight = clean_exit.drain(timeout=0.3)
        work.wait()
    else:
        time.sleep(2.0)
        torch.distributed.all_reduce(t)
        in_flight = None
    return dict(workers=len(clean_exit.gloo_workers()), settled=settled, idle=idle, in_flight=in_flight,
                sum=t.tolist())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_drain_waits_for_the_workers_and_gives_up_on_a_collective_in_flight():
    results = zero_ref.launch(workers_around_a_collective, 2, timeout=120)
    for r in results:
        assert r["workers"] >= 2 and r["settled"] and r["idle"]
        assert r["sum"] == [2.0] * 3  # (0 + 1), twice
    assert results[0]["in_flight"] is False  # the peer had not joined yet: drain timed out, as it says


def test_the_pipeline_client_exits_with_status_0_every_time(tmp_path):
    cfg = tmp_path / "pipeline.json"
    cfg.write_text(json.dumps(PIPELINE))
    torchrun = Path(sys.executable).with_name("torchrun")
    for run in range(RUNS):
        out = subprocess.run([str(torchrun), "--nproc_per_node=2", "-m", "course.labs.clients.pipeline", "--engine",
                              "zero_ref", "--deepspeed", "--deepspeed_config", str(cfg)], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, env=torchrun_env(DS_ACCELERATOR="cpu"))
        assert out.returncode == 0, f"run {run}: exit status {out.returncode}\n{out.stderr[-3000:]}"
        assert "terminate called" not in out.stderr
        assert any(x.startswith("RESULT ") for x in out.stdout.splitlines()), out.stdout[-2000:]
