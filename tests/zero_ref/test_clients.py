"""course/labs/clients under torchrun (2 CPU ranks), once with DeepSpeed 0.19.8 and once with zero_ref: the same
losses step by step (fp32, 1e-6 relative, 10 steps), the same replay after loading the checkpoint, exit status 0.
(tests/clients/ runs DeepSpeed-style scripts unedited through zero_ref.ds.run; these labs show the one-line swap.)"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PEER_RUN, ROOT, torchrun_env

CONFIGS = {
    "classifier": {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
                   "optimizer": {"type": "AdamW", "params": {"lr": 5e-3, "torch_adam": True}},
                   "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2,
                                                                "cycle_first_step_size": 4}},
                   "zero_optimization": {"stage": 2}, "my_script_key": "DeepSpeed ignores it"},
    "pipeline": {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4, "gradient_clipping": 0.0,
                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
                 "zero_optimization": {"stage": 1}, "steps_per_print": 100},
}


def run(script: str, engine: str, tmp_path) -> dict:
    cfg = tmp_path / f"{script}.json"
    cfg.write_text(json.dumps(CONFIGS[script]))
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--nproc_per_node=2", *(PEER_RUN if engine == "deepspeed" else []), "-m",
                          f"course.labs.clients.{script}", "--engine", engine,
                          "--deepspeed", "--deepspeed_config", str(cfg)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=torchrun_env(DS_ACCELERATOR="cpu"))
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0, f"{script} on {engine} exited with {out.returncode}:\n{out.stderr[-3000:]}"
    assert lines, out.stdout[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.parametrize("script", list(CONFIGS))
def test_client_script_gives_deepspeeds_losses(script, tmp_path):
    ours, theirs = run(script, "zero_ref", tmp_path), run(script, "deepspeed", tmp_path)
    assert len(ours["losses"]) == 10
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6)
    assert ours["losses"][-1] < ours["losses"][0]
    if script == "classifier":  # resumed from the half-way checkpoint: the two steps after it, again
        mine = {"step": 5, "seen": 20}  # (DeepSpeed hands back its own entries of the file too)
        assert ours["client_state"] == {k: theirs["client_state"][k] for k in mine} == mine
        assert ours["replayed"] == pytest.approx(theirs["replayed"], rel=1e-6)
        assert ours["replayed"] == pytest.approx(ours["losses"][5:7], rel=1e-6)
        assert ours["lr"] == pytest.approx(theirs["lr"], rel=1e-9)
