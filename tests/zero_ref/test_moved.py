"""Old module paths keep working for one release: the same module object, and a warning naming the new path."""
import importlib
import json
import pkgutil
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import zero_ref
from zero_ref._moved import MOVED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_an_old_path_imports_the_moved_module_and_warns(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new  # the module keeps its own name and spec


def where_the_warning_points(lines: str) -> str:
    """Run ``lines`` in a fresh interpreter; the file and line the first DeprecationWarning is attributed to."""
    code = ("import warnings\nwith warnings.catch_warnings(record=True) as seen:\n    warnings.simplefilter('always')\n"
            f"    exec(compile({lines!r}, 'user.py', 'exec'))\n"
            "w = [w for w in seen if w.category is DeprecationWarning][0]\nprint(f'{w.filename}:{w.lineno}')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-1500:]
    return out.stdout.strip()


def test_the_warning_points_at_the_line_that_named_the_old_path():
    assert where_the_warning_points("import os\nfrom zero_ref.batch import resolve_batch_sizes") == "user.py:2"
    assert where_the_warning_points("import zero_ref\n\nzero_ref.topology") == "user.py:3"  # the face's attribute


def test_every_module_of_the_package_is_listed_in_its_face():
    names = {m.name for m in pkgutil.iter_modules(zero_ref.__path__) if not m.name.startswith("_")}
    assert set(zero_ref._MODULES) == names and "launcher" in names


def test_deepspeed_names_on_the_face():
    ds = zero_ref
    for name in ("initialize", "init_distributed", "add_config_arguments", "launch"):
        assert callable(getattr(ds, name)), name
    assert hasattr(ds.zero, "Init") and hasattr(ds.zero, "GatheredParameters")
    assert hasattr(ds.checkpointing, "checkpoint") and hasattr(ds.comm, "all_reduce")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DeepSpeed's names are not deprecated
        importlib.import_module("zero_ref.checkpointing")


def test_the_project_itself_names_no_old_path():
    """The shims are for hand-ins and user scripts: the code, docs and notebook cells name the new homes."""
    old = "|".join(re.escape(name) for name in MOVED)
    dotted = re.compile(rf"(?<![\w.])({old})\b")
    gone = [n.replace(".", "/") for n in MOVED] + [f"zero_ref/{n}" for n in ("config", "checkpoint", "offload",
                                                                           "checkpointing")]  # now folders, or renamed
    slashed = re.compile(rf"(?<![\w/])({'|'.join(map(re.escape, gone))})\.py\b")
    dirs = ("zero_ref", "sim", "course", "tests", "benchmarks", "scripts", "notebooks")
    files = [ROOT / "README.md", *(p for d in dirs for p in (ROOT / d).rglob("*")
                                   if p.suffix in (".py", ".md", ".ipynb"))]
    found = []
    for path in files:
        if path.name in ("_moved.py", "test_moved.py") or ".ipynb_checkpoints" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".ipynb":  # the cells as written, not their stored outputs
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in (*dotted.finditer(text), *slashed.finditer(text))]
    assert not found, found
