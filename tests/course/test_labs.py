"""Lab scripts run under torchrun exactly as the README shows."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, torchrun_env


@pytest.mark.slow
def test_data_parallel_lab_under_torchrun():
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--nproc_per_node=2", "-m", "course.labs.data_parallel", "--steps", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=240,
                         env=torchrun_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ranks=2" in out.stdout and out.stdout.rstrip().endswith("OK"), out.stdout


@pytest.mark.slow
def test_three_d_lab_under_torchrun(tmp_path):
    """tp × pp × dp = 2 × 2 × 2 with ZeRO-1 on 8 ranks: the loss curve is written and equals one process."""
    torchrun = Path(sys.executable).with_name("torchrun")
    out_file = tmp_path / "loss.json"
    out = subprocess.run([str(torchrun), "--nproc-per-node", "8", "-m", "course.labs.three_d", "--steps", "3",
                          "--check", "--out", str(out_file)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=torchrun_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tp=2 pp=2 dp=2" in out.stdout and out.stdout.rstrip().endswith("OK"), out.stdout
    curve = json.loads(out_file.read_text())
    assert curve["steps"] == [0, 1, 2] and len(curve["loss"]) == 3 and curve["max_param_diff"] < 1e-4


@pytest.mark.slow
@pytest.mark.peers
def test_either_engine_lab_gives_deepspeeds_losses():
    """course/labs/either_engine.py under torchrun, once per engine: the same losses (same script, same config)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    results = {}
    for engine in ("zero_ref", "deepspeed"):
        out = subprocess.run([str(torchrun), "--nproc_per_node=2", "-m", "course.labs.either_engine", "--engine", engine,
                              "--stage", "2", "--steps", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env=torchrun_env(DS_ACCELERATOR="cpu"))
        lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        # RESULT is printed after the last collective; a gloo abort in teardown after it does not undo it
        assert lines and (out.returncode == 0 or "terminate called without an active exception" in out.stderr), \
            out.stderr[-3000:]
        results[engine] = json.loads(lines[-1][len("RESULT "):])
    ours, theirs = results["zero_ref"], results["deepspeed"]
    assert ours["train_batch_size"] == theirs["train_batch_size"] == 8 and len(ours["losses"]) == 2
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6)


def _three_d_lab_twice(rank, world):
    """The lab with ThreeD's step, then with a step whose replicas all train on replica 0's rows."""
    import torch

    from course.labs import three_d as lab
    from zero_ref import comm

    def replica_zero_rows(trainer, idx, targets):
        n = idx.shape[0] // trainer.topology.dp
        mine = list(zip(idx[:n].chunk(trainer.microbatches), targets[:n].chunk(trainer.microbatches)))
        stats = trainer.pipeline.train_step(mine, optimizer=trainer.optimizer)
        trainer.optimizer.step()
        loss = torch.tensor([stats.loss / trainer.topology.dp if stats.loss is not None and trainer.t == 0 else 0.0],
                            dtype=torch.float64)
        comm.all_reduce(loss)
        return stats, loss.item()

    return [lab.run(rank, world, steps=3, check=True, step=step) for step in (None, replica_zero_rows)]


@pytest.mark.slow
def test_the_three_d_labs_check_tells_a_wrong_step_from_a_right_one():
    """verdict passes the lab's own step and fails a step that feeds every replica the same rows."""
    import zero_ref
    from course.labs import three_d as lab
    right, wrong = zero_ref.launch(_three_d_lab_twice, 8, timeout=600)[0]
    assert lab.verdict(right["loss"], right["reference_loss"], right["max_param_diff"]) == "OK"
    assert lab.verdict(wrong["loss"], wrong["reference_loss"], wrong["max_param_diff"]) == "MISMATCH"
    assert max(abs(a - b) for a, b in zip(wrong["loss"][1:], wrong["reference_loss"][1:])) > 100 * lab.LOSS_TOL


def test_the_three_d_lab_names_a_model_it_cannot_train():
    """Another shape of the byte-level GPT is accepted; another vocabulary, or a check on another shape, is refused."""
    from course.labs import three_d as lab
    from zero_ref.models import GPTConfig

    with pytest.raises(ValueError, match="vocab_size must be 256"):
        lab.run(0, 8, cfg=GPTConfig(vocab_size=128, seq_len=16, d_model=32, n_heads=4, n_layers=4))
    with pytest.raises(ValueError, match="check trains the reference on the lab's CFG"):
        lab.run(0, 8, check=True, cfg=GPTConfig(vocab_size=256, seq_len=16, d_model=32, n_heads=4, n_layers=4))


def _one_step_of_another_shape(rank, world):
    from course.labs import three_d as lab
    from zero_ref.models import GPTConfig

    cfg = GPTConfig(vocab_size=256, seq_len=16, d_model=32, n_heads=4, n_layers=4)
    return lab.run(rank, world, tp=2, pp=2, steps=1, cfg=cfg)


@pytest.mark.slow
def test_the_three_d_lab_trains_another_shape():
    """cfg reaches the model and the batch: each rank holds its share of the smaller GPT (2 × 2 × 2, ZeRO-1)."""
    import zero_ref

    d, V, T = 32, 256, 16
    block = (12 * d * d + 7 * d) // 2 + 6 * d                 # tp splits the matrices, replicates biases and norms
    first = 2 * block + V // 2 * d + T * d                     # embedding shard and position table
    last = 2 * block + 2 * d + V // 2 * d                      # final norm and the head's copy of the embedding
    for r in zero_ref.launch(_one_step_of_another_shape, 8, timeout=300):
        assert r["local_params"] == (first if r["coords"][2] == 0 else last), r["coords"]
        assert r["memory"]["params"] == 4 * r["local_params"] and len(r["loss"]) == 1
