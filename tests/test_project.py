"""The project's own promises: README commands, generated chapter table, CI entry, environments agree."""
import os
import pkgutil
import re
import subprocess
import sys

import sim
import zero_ref.config

from course.syllabus import readme_table

from tests.helpers import ROOT


def test_readme_chapter_table_is_generated_from_the_syllabus():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- chapters:start.*?-->\n(.*?)\n<!-- chapters:end -->", text, re.S)
    assert block, "README lacks the chapters block"
    assert block.group(1) == readme_table().rstrip("\n"), "run: python -m course.syllabus, paste into README"


def test_readme_names_the_two_commands_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    assert "make lab" in text and "make test" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^(step )?make test$", ci, re.M)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lab: setup$", makefile, re.M) and re.search(r"^test: setup$", makefile, re.M)


def test_torch_pin_is_the_same_everywhere():
    pins = {p: re.findall(r"torch==[\d.]+", (ROOT / p).read_text())
            for p in ("scripts/setup_env.sh", "environment.yml", "README.md")}
    assert all(v and set(v) == {"torch==2.13.0"} for v in pins.values()), pins


def test_requirements_are_pinned():
    for name in ("requirements.txt", "requirements-dev.txt", "requirements-peers.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("-r"):
                assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[\w.]+", line), f"{name}: {line!r} is not pinned"


# The torch-free floor: the simulator and the zero_ref modules it stands on import neither torch nor, until a
# figure is drawn, matplotlib or ipywidgets, so planning a run needs no deep-learning stack.
TORCH_FREE = ("zero_ref", "zero_ref.memory", "zero_ref.ds.runtime.lr_schedules",
              "zero_ref.config", *(f"zero_ref.config.{m.name}" for m in pkgutil.iter_modules(zero_ref.config.__path__)),
              "zero_ref.parallel", "zero_ref.parallel.topology", "zero_ref.parallel.schedules",
              "sim", *(m.name for m in pkgutil.walk_packages(sim.__path__, "sim.")))
HEAVY = ("torch", "matplotlib", "ipywidgets")


def test_the_torch_free_floor_imports_no_torch():
    """One fresh interpreter imports the floor module by module and names the first that pulls in a heavy one."""
    code = (f"import importlib, sys\nfor name in {TORCH_FREE!r}:\n    importlib.import_module(name)\n"
            f"    loaded = [h for h in {HEAVY!r} if h in sys.modules]\n"
            "    assert not loaded, f'importing {name} loaded {loaded}'")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_stale_extension_lock_is_removed_and_a_live_one_kept(tmp_path, monkeypatch):
    from tests.conftest import STALE_LOCK_S, remove_stale_extension_locks
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale, live = tmp_path / "py311_cpu" / "op_a" / "lock", tmp_path / "py311_cpu" / "op_b" / "lock"
    for lock in (stale, live):
        lock.parent.mkdir(parents=True)
        lock.touch()
    now = stale.stat().st_mtime
    os.utime(stale, (now - STALE_LOCK_S - 1, now - STALE_LOCK_S - 1))
    assert remove_stale_extension_locks(now) == [str(stale)] and live.exists() and not stale.exists()
