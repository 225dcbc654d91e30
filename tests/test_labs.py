"""Lab scripts run under torchrun exactly as the README shows."""
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
