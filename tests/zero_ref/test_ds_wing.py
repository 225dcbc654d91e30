"""The pipeline engine reaches initialize through a registry (that no module below the ds wing imports it, and
that the engine and the pipeline form no import cycle, tests/test_layering.py checks for every module)."""
import subprocess
import sys

from tests.helpers import ROOT


def test_initialize_builds_a_pipeline_engine_for_a_pipeline_module():
    code = ("from zero_ref.ds.engine import ENGINES\nfrom zero_ref.ds.pipe import PipelineEngine, PipelineModule\n"
            "assert ENGINES[PipelineModule] is PipelineEngine")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
