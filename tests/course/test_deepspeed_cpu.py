"""course.labs.deepspeed_cpu: DeepSpeed on its CPU accelerator, with no shared-memory op to compile."""
import subprocess
import sys

import pytest

from tests.helpers import ROOT

CODE = """
import os
from course.labs.deepspeed_cpu import import_deepspeed
deepspeed = import_deepspeed()
from deepspeed.accelerator import get_accelerator
from deepspeed.comm.torch import build_shm_op
print(os.environ["DS_ACCELERATOR"], get_accelerator().device_name(), build_shm_op())
"""


@pytest.mark.peers
def test_deepspeed_runs_on_its_cpu_accelerator_and_builds_no_op():
    env = {k: v for k, v in __import__("os").environ.items() if k != "DS_ACCELERATOR"}
    out = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["cpu", "cpu", "None"], out.stdout
