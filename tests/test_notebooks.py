"""Every chapter notebook follows the contract, and its checks really grade.

For each ``notebooks/ch*.ipynb``: ``course.build --check`` finds nothing; the student release
fails every graded task (no answer leaks through a check that passes on a stub); the
first chapter's reference also goes through the grader and passes every task. The strict output
comparison of every reference notebook (which is what "the reference passes") is a separate run: ``pytest --nbval notebooks/ --nbval-sanitize-with course/nbval_sanitize.cfg``.
"""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from course import assign, build

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("ch*.ipynb"))


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """Every chapter's student release, graded two at a time (each grade is an nbval subprocess, mostly
    single-threaded: two keep both cores busy); each test waits only for its own chapter."""
    folder = tmp_path_factory.mktemp("release")
    pool = ThreadPoolExecutor(2)

    def grade_release(path):
        student = folder / path.name
        nbformat.write(assign.make_release(nbformat.read(path, as_version=4)), student)
        return assign.grade(student, path)

    yield {path: pool.submit(grade_release, path) for path in NOTEBOOKS}
    pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_contract_and_grading(path, released):
    assert build.check_file(path) == [], f"{path.name}: run python -m course.build --check"

    reference = nbformat.read(path, as_version=4)
    tasks = assign.graded_tasks(reference)
    report = released[path].result()
    assert set(report.tasks) == tasks
    passing = {t: r.reason for t, r in report.tasks.items() if r.passed}
    assert not passing, f"{path.name}: these checks pass on the stub: {sorted(passing)}"

    if path == NOTEBOOKS[0]:
        # The reference passing its own checks is what the strict nbval run of every notebook shows;
        # grading one real chapter's reference proves the grader's path too (cell matching, cwd).
        solved = assign.grade(path, path)
        failing = {t: r.reason for t, r in solved.tasks.items() if not r.passed}
        assert set(solved.tasks) == tasks and not failing, f"{path.name}: reference fails {failing}"


def test_every_syllabus_chapter_has_its_notebook():
    """Thirty chapters in the syllabus, thirty notebooks, the same names (the contract test above then
    checks each one's goals, sections, misconceptions, exercises, graded checks and summary)."""
    from course.syllabus import CHAPTERS

    assert [p.name for p in NOTEBOOKS] == [ch.notebook for ch in CHAPTERS]
