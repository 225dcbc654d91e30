"""The assignment tooling on a small, pure-Python fixture notebook (tests/fixtures/ch99_example).

Chapter 99 is not in the syllabus: the tests that need one install a stand-in module.
Grading runs real nbval subprocesses, so the three student variants are graded once, together,
through the command line (which also covers the table and the JSON report).
"""

import contextlib
import io
import json
import re
import subprocess
import sys
import types
from dataclasses import asdict
from pathlib import Path

import nbformat
import pytest

from course import assign, build

FIXTURE = Path(__file__).parent / "fixtures" / "ch99_example.ipynb"
from tests.helpers import ROOT as REPO


def reference():
    return nbformat.read(FIXTURE, as_version=4)


def cell(nb, cell_id):
    return next(c for c in nb.cells if c.id == cell_id)


@pytest.fixture
def syllabus(monkeypatch):
    """A stand-in ``course.syllabus`` that knows chapter 99, titled as the fixture is."""
    ch = types.SimpleNamespace(number=99, slug="example", title_en="Example chapter",
                               title_zh="示例章节", goals=[], seed="", modules=[],
                               notebook="ch99_example.ipynb")
    module = types.ModuleType("course.syllabus")
    module.CHAPTERS = [ch]
    module.chapter = lambda n: {99: ch}[n]
    module.by_slug = lambda slug: {"example": ch}[slug]
    module.title_markdown = lambda c: cell(reference(), "title").source
    monkeypatch.setitem(sys.modules, "course.syllabus", module)
    for name in ("chapter", "title_markdown"):  # the builder imported them at its top
        monkeypatch.setattr(build, name, getattr(module, name))
    return module


# --- release --------------------------------------------------------------------------------

def test_release_replaces_regions_exactly_and_clears_outputs(tmp_path):
    ref = reference()
    student = assign.make_release(ref)
    assert cell(student, "task-99-1-solution").source == (
        'def adam_state_bytes(n_params):\n'
        '    """fp32 momentum + fp32 variance."""\n'
        '    raise NotImplementedError("Task 99.1")')
    assert cell(student, "task-99-2-solution").source == (
        "# Rank r gets one extra item while r < n % world.\n"
        'raise NotImplementedError("Task 99.2")')
    for old, new in zip(ref.cells, student.cells):
        assert (old.id, old.metadata.get("tags")) == (new.id, new.metadata.get("tags"))
        if "solution" not in new.metadata.get("tags", []):
            assert new.source == old.source  # graded cells and prose travel unchanged
        if new.cell_type == "code":
            assert new.outputs == [] and new.execution_count is None
    assert ref == reference(), "make_release must not modify its argument"

    assert assign.release_main([str(FIXTURE), "-o", str(tmp_path)]) == 0
    assert nbformat.read(tmp_path / FIXTURE.name, as_version=4) == student


def test_the_workspace_adds_missing_chapters_and_never_touches_the_students(tmp_path, capsys):
    """`make lab` opens work/: the release of each chapter, made once; a student's notebook is never replaced."""
    other = tmp_path / "ch98_other.ipynb"
    other.write_text(FIXTURE.read_text())
    work = tmp_path / "work"
    assert assign.workspace_main([str(FIXTURE), "-o", str(work)]) == 0
    assert nbformat.read(work / FIXTURE.name, as_version=4) == assign.make_release(reference())
    mine = nbformat.read(work / FIXTURE.name, as_version=4)
    cell(mine, "task-99-1-solution").source = "def adam_state_bytes(n_params):\n    return 8 * n_params"
    nbformat.write(mine, work / FIXTURE.name)
    before = (work / FIXTURE.name).read_bytes()
    written, kept = assign.workspace([FIXTURE, other], work)  # a new chapter appears in the course
    assert written == [work / other.name] and kept == [work / FIXTURE.name]
    assert (work / FIXTURE.name).read_bytes() == before  # the student's answer is still there
    assert assign.workspace_main([str(FIXTURE), str(other), "-o", str(work)]) == 0
    assert "0 chapter(s) added, 2 of yours kept unchanged" in capsys.readouterr().out


def test_make_lab_opens_the_workspace_unless_told_the_reference():
    root = Path(__file__).resolve().parents[2]
    default = subprocess.run(["make", "-n", "lab"], cwd=root, capture_output=True, text=True).stdout
    assert "course.assign workspace notebooks/ch*.ipynb -o work" in default and "--notebook-dir=work" in default
    ref = subprocess.run(["make", "-n", "lab", "NOTEBOOK_DIR=notebooks"], cwd=root, capture_output=True, text=True).stdout
    assert "--notebook-dir=notebooks" in ref


BAD_MARKERS = {
    "### BEGIN SOLUTION\nx = 1\n": "has no ### END SOLUTION",
    "x = 1\n### END SOLUTION\n": "without ### BEGIN SOLUTION",
    "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n### END SOLUTION": "nested",
    "x = 1  # no region": "has no ### BEGIN SOLUTION region",
}


@pytest.mark.parametrize("source, message", BAD_MARKERS.items())
def test_release_rejects_malformed_markers(source, message):
    nb = reference()
    cell(nb, "task-99-2-solution").source = source
    with pytest.raises(assign.NotebookError, match=re.escape(message)) as err:
        assign.make_release(nb, name="ch99_example.ipynb")
    assert "ch99_example.ipynb: cell 12 (id task-99-2-solution)" in str(err.value)


@pytest.mark.parametrize("tags, message", [(["solution"], "needs exactly one task-N.M tag"),
                                           ([], "has solution markers but no 'solution' tag")])
def test_release_rejects_untagged_solutions(tags, message):
    nb = reference()
    cell(nb, "task-99-1-solution").metadata["tags"] = tags
    with pytest.raises(assign.NotebookError, match=re.escape(message)):
        assign.make_release(nb)


# --- grading --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade the reference, the release and a wrong answer in one CLI call."""
    root = tmp_path_factory.mktemp("students")
    wrong = reference()
    cell(wrong, "task-99-1-solution").source = (
        "def adam_state_bytes(n_params):\n    return 4 * n_params  # forgot the variance")
    # Editing the check to print the expected text must not help.
    cell(wrong, "task-99-1-graded").source = 'print("52.15 GiB")'
    students = {"reference": reference(), "release": assign.make_release(reference()),
                "wrong": wrong}
    paths = []
    for name, nb in students.items():
        (root / name).mkdir()
        nbformat.write(nb, root / name / FIXTURE.name)
        paths.append(str(root / name / FIXTURE.name))
    out, table = root / "grades.json", io.StringIO()
    with contextlib.redirect_stdout(table):
        assert assign.grade_main([*paths, "--reference-dir", str(FIXTURE.parent),
                                  "--json", str(out)]) == 0
    reports = {Path(r["student"]).parent.name: r for r in json.loads(out.read_text())}
    return reports, table.getvalue()


def test_grading_the_reference_passes_every_task(graded):
    reports, _ = graded
    assert reports["reference"]["points"] == 2
    assert all(t["passed"] for t in reports["reference"]["tasks"].values())


def test_grading_the_release_fails_every_task_with_its_stub(graded):
    tasks = graded[0]["release"]["tasks"]
    assert tasks == {t: {"passed": False, "reason": f"NotImplementedError: Task {t}"}
                     for t in ("99.1", "99.2")}


def test_a_wrong_answer_fails_only_its_task(graded):
    tasks = graded[0]["wrong"]["tasks"]
    assert tasks["99.2"]["passed"] and not tasks["99.1"]["passed"]
    assert tasks["99.1"]["reason"] == "AssertionError: two fp32 tensors per parameter"


def test_grading_versions_together_gives_each_its_own_report(graded):
    """The release first (run whole), then the wrong answer's and the reference's exercises in the same kernel:
    the same results as grading each alone (the wrong answer has its check back: the reference's)."""
    wrong = reference()
    cell(wrong, "task-99-1-solution").source = (
        "def adam_state_bytes(n_params):\n    return 4 * n_params  # forgot the variance")
    together = assign.grade_together({"release": assign.make_release(reference()), "wrong": wrong,
                                      "reference": reference()}, FIXTURE)
    alone = graded[0]
    assert {name: {t: asdict(r) for t, r in report.tasks.items()} for name, report in together.items()} == \
        {name: alone[name]["tasks"] for name in ("release", "reference", "wrong")}


def test_grade_table_has_one_row_per_student(graded):
    lines = graded[1].splitlines()
    assert lines[0].split() == ["student", "99.1", "99.2", "points"]
    rows = {Path(ln.split()[0]).parent.name: ln.split()[1:] for ln in lines[1:4]}
    assert rows == {"reference": ["✓", "✓", "2/2"], "release": ["✗", "✗", "0/2"],
                    "wrong": ["✗", "✓", "1/2"]}


def test_grading_a_class_folder_gives_one_row_per_student_and_a_csv(tmp_path):
    """`python -m course.assign class SUBMISSIONS/`: folders are students; a missing notebook fails."""
    subs = tmp_path / "submissions"
    for name, nb in {"ada": reference(), "bob": assign.make_release(reference())}.items():
        (subs / name).mkdir(parents=True)
        nbformat.write(nb, subs / name / FIXTURE.name)
    (subs / "cy").mkdir()  # handed in nothing
    table, csv_path = io.StringIO(), tmp_path / "grades.csv"
    with contextlib.redirect_stdout(table):
        assert assign.class_main([str(subs), "--reference-dir", str(FIXTURE.parent), "--csv", str(csv_path),
                                  "--jobs", "2"]) == 0
    rows = {ln.split()[0]: ln.split()[1:] for ln in table.getvalue().splitlines()[1:4]}
    assert rows == {"ada": ["✓", "✓", "2/2"], "bob": ["✗", "✗", "0/2"], "cy": ["✗", "✗", "0/2"]}
    assert "cy task 99.1: not handed in: ch99_example.ipynb" in table.getvalue()
    assert csv_path.read_text().splitlines() == ["student,99.1,99.2,points,max", "ada,1,1,2,2", "bob,0,0,0,2",
                                                 "cy,0,0,0,2"]


def test_grading_notebook_uses_the_reference_checks():
    """Matching is by cell id, else by task tag order; a deleted check is put back."""
    ref, student = reference(), reference()
    cell(student, "task-99-1-graded").id = "renamed"       # matched by its task tag
    student.cells.remove(cell(student, "task-99-2-graded"))  # restored after the solution
    for c in student.cells:
        if "graded" in c.metadata.get("tags", []):
            c.source = "print('52.15 GiB')"
    cell(student, "task-99-2-solution").metadata["tags"].append("nbval-skip")  # stripped
    nb, tasks = assign.grading_notebook(student, ref, FIXTURE.parent)
    code = [c for c in nb.cells if c.cell_type == "code"]
    checked = [c for c in code if "nbval-check-output" in assign.tags(c)]
    assert [c.source for c in checked] == [cell(ref, i).source for i in
                                           ("task-99-1-graded", "task-99-2-graded")]
    assert [c.outputs for c in checked] == [cell(ref, i).outputs for i in
                                            ("task-99-1-graded", "task-99-2-graded")]
    assert all(c.outputs == [] for c in code if c not in checked)
    assert tasks[-1] == ["99.2"] and code[-2].id == "task-99-2-solution"
    assert assign.tags(code[-2]) == ["solution", "task-99.2"]
    assert code[0].source == f"import os\nos.chdir({str(FIXTURE.parent)!r})"


def test_failure_reason_summarises_an_output_mismatch():
    report = ("Notebook cell execution failed\nCell 7: Cell outputs differ\n\nInput:\nprint(x)\n\n"
              "Traceback:\n mismatch 'stdout'\n\n"
              " assert reference_output == test_output failed:\n\n"
              "  '[3, 2, 2]\\n' == 'debug\\n[3, 2, 2]\\n'\n  \n  - debug\n    [3, 2, 2]\n")
    assert assign.failure_reason(report) == (
        "output differs from the reference: mismatch 'stdout': "
        "expected '[3, 2, 2]\\n', got 'debug\\n[3, 2, 2]\\n'")
    assert assign.failure_reason("...\n#x1B[31mValueError#x1B[39m: bad\n") == "ValueError: bad"


# --- sanitizing and building ----------------------------------------------------------------

def test_strict_nbval_passes_with_the_sanitize_config():
    """The fixture prints an address, a port, a pid, a /tmp path and a timing."""
    cmd = [sys.executable, "-m", "pytest", "--nbval", str(FIXTURE), "-p", "no:cacheprovider",
           "--nbval-sanitize-with", str(REPO / "course" / "nbval_sanitize.cfg"), "-q"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_check_accepts_the_fixture_and_catches_a_wrong_title(syllabus, tmp_path, capsys):
    path = tmp_path / FIXTURE.name
    nb = reference()
    nbformat.write(nb, path)
    assert build.main(["--check", str(path)]) == 0
    nb.cells[0].source += " (edited)"
    nbformat.write(nb, path)
    assert build.main(["--check", str(path)]) == 1
    assert f"{path}: cell 0 differs from the syllabus title" in capsys.readouterr().err


@pytest.mark.parametrize("edit, problem", [
    (lambda nb: nb.cells.pop(1), "missing section heading '## Concept'"),
    (lambda nb: nb.cells.insert(1, nb.cells.pop(6)), "section headings out of order"),
    (lambda nb: cell(nb, "task-99-1-graded").metadata.update(tags=["graded", "task-3.1"]),
     "graded cell needs a task-99.M tag"),
    (lambda nb: cell(nb, "task-99-2-solution").metadata.update(tags=["solution"]),
     "solution cell needs a task-99.M tag"),
    (lambda nb: cell(nb, "task-99-2-solution").update(source="### BEGIN SOLUTION\n"),
     "has no ### END SOLUTION"),
    (lambda nb: [c.metadata.update(tags=[]) for c in nb.cells[1:]], "no graded cell"),
    (lambda nb: cell(nb, "task-99-2-graded").update(execution_count=None), "was not executed"),
    (lambda nb: cell(nb, "task-99-2-graded").update(source="print(shard_sizes(10, 4))"),
     "prints through course.canon.echo, not print"),
    (lambda nb: nb.cells.insert(2, nbformat.v4.new_code_cell("print(inspect.getsource(shard_sizes))")),
     "show library code with course.show"),
])
def test_check_names_each_problem(edit, problem):
    nb = reference()
    assert build.problems(nb, 99, None) == []
    edit(nb)
    assert any(problem in p for p in build.problems(nb, 99, None)), build.problems(nb, 99, None)


def test_build_reproduces_the_fixture_and_the_template_builds(syllabus, tmp_path):
    """Building is deterministic (the committed fixture is its own expected output), and a
    fresh template passes --check once built."""
    path = tmp_path / FIXTURE.name
    stale = reference()
    for c in stale.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    stale.cells.pop(0)  # the builder inserts the title cell
    nbformat.write(stale, path)
    build.build_file(path)
    built, ref = nbformat.read(path, as_version=4), reference()
    assert [c.id for c in built.cells] == [c.id for c in ref.cells]
    for old, new in zip(ref.cells, built.cells):
        assert "execution" not in new.metadata
        if new.cell_type == "code" and new.id not in ("volatile", "ignored"):
            assert (new.execution_count, new.outputs) == (old.execution_count, old.outputs)

    template = build.new_notebook(99)
    assert build.problems(template, 99, syllabus.title_markdown(None), executed=False) == []
    nbformat.write(template, path)
    build.build_file(path)
    assert build.check_file(path) == []
    released = assign.make_release(nbformat.read(path, as_version=4))
    assert 'raise NotImplementedError("Task 99.1")' in released.cells[6].source
