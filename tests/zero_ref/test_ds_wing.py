"""The ds wing sits on top: zero_ref's own modules never import it, and the engine never imports the pipeline."""
import ast
import pathlib
import subprocess
import sys

from tests.helpers import ROOT

PKG = ROOT / "zero_ref"


def imported(path: pathlib.Path) -> set[str]:
    """Every module a file names in an import statement, at any depth (function-level ones included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return names


# Modules that run a whole engine step, the way a script does, and so sit above the wing.
ABOVE = {"zero_ref/profiling/trial.py"}


def test_nothing_below_the_ds_wing_imports_it():
    below = [p for p in PKG.rglob("*.py") if p.relative_to(PKG).parts[0] != "ds" and p != PKG / "__init__.py"
             and str(p.relative_to(ROOT)) not in ABOVE]
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in imported(p) if n.startswith("zero_ref.ds"))
                 for p in below}
    assert {p: n for p, n in offenders.items() if n} == {}


def test_the_engine_does_not_import_the_pipeline_engine():
    """The pipeline registers itself with initialize (ENGINES), so engine and pipe form no import cycle."""
    for name in ("engine.py", "compat.py", "torch_backward.py"):
        assert not any(n.startswith("zero_ref.ds.pipe") for n in imported(PKG / "ds" / name)), name


def test_initialize_builds_a_pipeline_engine_for_a_pipeline_module():
    code = ("from zero_ref.ds.engine import ENGINES\nfrom zero_ref.ds.pipe import PipelineEngine, PipelineModule\n"
            "assert ENGINES[PipelineModule] is PipelineEngine")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
