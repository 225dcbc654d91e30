"""The project's own promises: README commands, generated chapter table, CI entry, environments agree."""
import re
from pathlib import Path

from course.syllabus import readme_table

ROOT = Path(__file__).resolve().parents[1]


def test_readme_chapter_table_is_generated_from_the_syllabus():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- chapters:start.*?-->\n(.*?)\n<!-- chapters:end -->", text, re.S)
    assert block, "README lacks the chapters block"
    assert block.group(1) == readme_table().rstrip("\n"), "run: python -m course.syllabus, paste into README"


def test_readme_names_the_two_commands_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    assert "make lab" in text and "make test" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)
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
