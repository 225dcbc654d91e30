"""A resume draws what it draws under DeepSpeed: load_checkpoint leaves the torch RNG as it is (DeepSpeed
0.19.8 saves no RNG state, runtime/engine.py ``_save_checkpoint`` / ``_load_checkpoint``), and
``load_rng_state=True`` continues each rank's saved stream instead."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zero_ref
from tests.helpers import PEER_RUN, ROOT, torchrun_env

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # real multi-rank jobs
SCRIPT = Path(__file__).with_name("resume_rng_script.py")


def draws_around_load(rank, world, root):
    """Save after two steps (dropout draws from the RNG), then reseed and load, with and without the option."""
    from tests.zero_ref.resume_rng_script import engine_and_steps

    engine, steps = engine_and_steps(zero_ref.ds, rank)
    steps(2)
    engine.save_checkpoint(root, tag="two")
    saved_stream = torch.rand(4)  # what the saved RNG state draws next
    torch.manual_seed(7 + rank)
    engine.load_checkpoint(root, tag="two")
    default = torch.rand(4)
    torch.manual_seed(7 + rank)
    engine.load_checkpoint(root, tag="two", load_rng_state=True)
    restored = torch.rand(4)
    return dict(saved_stream=saved_stream, default=default, restored=restored)


def load_at_another_size(rank, world, root):
    from tests.zero_ref.resume_rng_script import engine_and_steps

    engine, _ = engine_and_steps(zero_ref.ds, rank)
    engine.load_checkpoint(root, tag="two")  # the weights load at any world size
    try:
        engine.load_checkpoint(root, tag="two", load_rng_state=True)
    except zero_ref.checkpoint.CheckpointError as e:
        return str(e)
    return None


def test_load_leaves_the_rng_and_load_rng_state_restores_it(tmp_path):
    root = str(tmp_path / "ckpt")
    results = zero_ref.launch(draws_around_load, 2, root, timeout=240)
    for rank, r in enumerate(results):
        torch.manual_seed(7 + rank)
        assert torch.equal(r["default"], torch.rand(4)), f"rank {rank}: load_checkpoint moved the RNG"
        assert torch.equal(r["restored"], r["saved_stream"]), f"rank {rank}: load_rng_state=True did not restore it"
    assert not torch.equal(results[0]["saved_stream"], results[1]["saved_stream"])  # each rank's own stream
    error, = zero_ref.launch(load_at_another_size, 1, root, timeout=240)
    assert error is not None and "load_rng_state=True" in error and "2 ranks, this run has 1" in error


def run(engine: str, tmp_path) -> dict:
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--nproc_per_node=2", *PEER_RUN, str(SCRIPT), "--engine", engine, str(tmp_path / engine)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=torchrun_env(DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.peers
def test_a_resumed_script_draws_what_it_draws_under_deepspeed(tmp_path):
    """The same script under both engines: after load_checkpoint, torch.rand and the dropout losses of
    the resumed steps agree (fp32, 1e-6 relative); with the RNG restored they would not."""
    ours, theirs = run("zero_ref", tmp_path), run("deepspeed", tmp_path)
    for rank in range(2):
        torch.manual_seed(7 + rank)
        assert ours["draws"][rank] == theirs["draws"][rank] == torch.rand(3).tolist()
        assert ours["losses"][rank] == pytest.approx(theirs["losses"][rank], rel=1e-6)
        assert ours["resumed"][rank] == pytest.approx(theirs["resumed"][rank], rel=1e-6)
        # other dropout masks than the first run's steps 3-4: a restored RNG would have repeated them
        assert ours["resumed"][rank] != pytest.approx(ours["losses"][rank][2:], rel=1e-3)
