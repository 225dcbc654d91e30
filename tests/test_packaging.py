"""The project installs as a package: `pip install .` in a fresh virtual environment gives importable
`zero_ref`, `sim` and `course` and working console scripts, and every library the packages import is declared
in pyproject.toml (the exact pins of `make setup` stay in requirements*.txt and must satisfy those ranges)."""
import ast
import importlib.metadata as md
import subprocess
import sys
import sysconfig
import tomllib

import pytest
from packaging.requirements import Requirement

from tests.helpers import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DECLARED = {Requirement(r).name.lower(): Requirement(r)
            for r in PROJECT["dependencies"] + sum(PROJECT["optional-dependencies"].values(), [])}
PACKAGES = ("zero_ref", "sim", "course")


def third_party_imports() -> dict[str, str]:
    """Top-level module -> the first file:line importing it, over every module of the three packages."""
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_imported_library_is_declared():
    dists = md.packages_distributions()
    missing = {mod: where for mod, where in third_party_imports().items()
               if not {d.lower() for d in dists.get(mod, [mod])} & DECLARED.keys()}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_the_pinned_versions_satisfy_the_declared_ranges():
    for name in ("requirements.txt", "requirements-dev.txt", "requirements-peers.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if not line or line.startswith("-"):
                continue
            pin = Requirement(line)
            declared = DECLARED.get(pin.name.lower())
            if declared is not None:
                version = next(iter(pin.specifier)).version
                assert declared.specifier.contains(version), f"{name}: {pin} is outside pyproject's {declared}"


@pytest.mark.slow
def test_pip_install_dot_in_a_fresh_environment(tmp_path):
    """No network: the fresh environment sees the libraries `make setup` installed (one .pth line), so pip
    resolves the declared dependencies against them and installs only the project, from its own folder."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "venv" / site.split(str(venv) + "/")[1] / "libraries.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    out = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-index",
                          "--no-build-isolation", str(ROOT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    check = "import zero_ref, sim, course; print(zero_ref.__file__, sim.__file__, course.__file__)"
    files = subprocess.run([python, "-c", check], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert files.split() and all(f.startswith(site) for f in files.split()), files  # the installed copy
    for script in PROJECT["scripts"]:
        run = subprocess.run([venv / "bin" / script, "--help"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0 and "usage" in run.stdout.lower(), (script, run.stdout[-500:], run.stderr[-2000:])
    # the planner runs from the installed copy, presets and all, and writes a config zero_ref reads
    plan = subprocess.run([venv / "bin" / "zero-lab-sim", "plan", "--model", "llama-2-7b", "--gpus", "8", "--top", "1",
                           "--write-config", "ds.json"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0 and "chosen: " in plan.stdout, plan.stderr[-2000:]
    read = subprocess.run([python, "-c", "import zero_ref.config as c; print(c.parse(c.load('ds.json'), dp=8).zero_optimization.stage)"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert read.returncode == 0 and read.stdout.strip() in "0123", read.stderr[-2000:]
