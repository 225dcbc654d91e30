"""Lab scripts run under torchrun exactly as the README shows."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_data_parallel_lab_under_torchrun():
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--nproc_per_node=2", "-m", "course.labs.data_parallel", "--steps", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
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
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tp=2 pp=2 dp=2" in out.stdout and out.stdout.rstrip().endswith("OK"), out.stdout
    curve = json.loads(out_file.read_text())
    assert curve["steps"] == [0, 1, 2] and len(curve["loss"]) == 3 and curve["max_param_diff"] < 1e-4
