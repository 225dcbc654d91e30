"""Every chapter notebook follows the contract, and its checks really grade.

For each ``notebooks/ch*.ipynb``: ``course.build --check`` finds nothing; the student release
fails every graded task (no answer leaks through a check that passes on a stub); the
first chapter's reference also goes through the grader and passes every task. The strict output
comparison of every reference notebook (which is what "the reference passes") is a separate run: ``pytest --nbval notebooks/ --nbval-sanitize-with course/nbval_sanitize.cfg``.

Each chapter also has ``tests/alternatives/<notebook>.py``: ``RIGHT``, answers written in another style than
the reference (they must pass), and ``WRONG``, plausible mistakes (they must fail). They are graded in a second
release of the chapter where those tasks are answered and every other task is still a stub. That test is
marked ``other_isa``: `make test-portable` runs it, on another instruction set than the one that recorded the
expected outputs, which is what a correct answer on a student's or a grader's CPU meets.
"""
import runpy

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from course import assign, build

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("ch*.ipynb"))
ALTERNATIVES = Path(__file__).resolve().parent / "alternatives"


def alternatives(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(RIGHT, WRONG) of a chapter: task id → the code of a solution region."""
    found = runpy.run_path(str(ALTERNATIVES / f"{path.stem}.py"))
    return found["RIGHT"], found.get("WRONG", {})


@pytest.fixture(scope="module")
def released(tmp_path_factory, request):
    """Grades of every chapter's student release ("stub") and of its release with the alternative answers
    ("answered"), for the tests this run selected, two at a time (each grade is an nbval subprocess, mostly
    single-threaded: two keep both cores busy); each test waits only for its own chapter."""
    folder = tmp_path_factory.mktemp("release")
    pool = ThreadPoolExecutor(2)

    def grade_release(path, answers, kind):
        student = folder / kind / path.name
        student.parent.mkdir(exist_ok=True)
        nbformat.write(assign.make_release(nbformat.read(path, as_version=4), str(path), answers), student)
        return assign.grade(student, path)

    kinds = {"test_notebook_contract_and_grading": "stub", "test_alternative_answers_pass_and_mistakes_fail": "answered"}
    jobs = {}
    for item in request.session.items:  # only the chapters and kinds this run tests (-k, -m)
        kind = kinds.get(getattr(item, "originalname", ""))
        if kind:
            path = item.callspec.params["path"]
            answers = {} if kind == "stub" else {**alternatives(path)[0], **alternatives(path)[1]}
            jobs[kind, path] = pool.submit(grade_release, path, answers, kind)
    yield jobs
    pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_contract_and_grading(path, released):
    assert build.check_file(path) == [], f"{path.name}: run python -m course.build --check"

    reference = nbformat.read(path, as_version=4)
    tasks = assign.graded_tasks(reference)
    stub = released["stub", path].result()
    assert set(stub.tasks) == tasks
    passing = {t: r.reason for t, r in stub.tasks.items() if r.passed}
    assert not passing, f"{path.name}: these checks pass on the stub: {sorted(passing)}"

    if path == NOTEBOOKS[0]:
        # The reference passing its own checks is what the strict nbval run of every notebook shows;
        # grading one real chapter's reference proves the grader's path too (cell matching, cwd).
        solved = assign.grade(path, path)
        failing = {t: r.reason for t, r in solved.tasks.items() if not r.passed}
        assert set(solved.tasks) == tasks and not failing, f"{path.name}: reference fails {failing}"


@pytest.mark.slow
@pytest.mark.other_isa
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_alternative_answers_pass_and_mistakes_fail(path, released):
    right, wrong = alternatives(path)
    tasks = assign.graded_tasks(nbformat.read(path, as_version=4))
    assert right and not set(right) & set(wrong), f"{path.name}: at least one RIGHT answer, none also WRONG"
    assert set(right) | set(wrong) <= tasks, f"{path.name}: answers for tasks it does not have"
    answered = released["answered", path].result()
    assert set(answered.tasks) == tasks
    failing = {t: answered.tasks[t].reason for t in right if not answered.tasks[t].passed}
    assert not failing, f"{path.name}: correct answers in another style fail: {failing}"
    passing = sorted(t for t in tasks - set(right) if answered.tasks[t].passed)
    assert not passing, f"{path.name}: wrong answers (or stubs) pass: {passing}"


def test_every_syllabus_chapter_has_its_notebook():
    """Thirty chapters in the syllabus, thirty notebooks, the same names (the contract test above then
    checks each one's goals, sections, misconceptions, exercises, graded checks and summary)."""
    from course.syllabus import CHAPTERS

    assert [p.name for p in NOTEBOOKS] == [ch.notebook for ch in CHAPTERS]
