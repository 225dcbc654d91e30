"""Every chapter notebook follows the contract, and its checks really grade.

For each ``notebooks/ch*.ipynb``: ``course.build --check`` finds nothing; the student release
fails every graded task (no answer leaks through a check that passes on a stub); the
first chapter's reference also goes through the grader and passes every task. The strict output
comparison of every reference notebook (which is what "the reference passes") is a separate run:
``pytest --nbval notebooks/ --nbval-sanitize-with course/nbval_sanitize.cfg``.

Each chapter also has ``tests/alternatives/<notebook>.py``: ``RIGHT``, answers written in another style than
the reference (they must pass), and ``WRONG``, plausible mistakes (they must fail). They are graded in a second
release of the chapter where those tasks are answered and every other task is still a stub. ``MORE_WRONG``, a list
of further mistakes (also for tasks with a RIGHT answer), is graded one release per entry; they must fail too.

Both releases of a chapter are graded in one kernel (``assign.grade_together``). The grading tests are marked
``other_isa``: `make test-portable` runs them, on another instruction set than the one that recorded the
expected outputs, which is what a correct answer on a student's or a grader's CPU meets; `make test` checks
each chapter's contract and runs every reference under strict nbval.
"""
import runpy

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from course import answers_above, assign, build

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("ch*.ipynb"))
ALTERNATIVES = Path(__file__).resolve().parent / "alternatives"


def alternatives(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(RIGHT, WRONG) of a chapter: task id → the code of a solution region."""
    found = runpy.run_path(str(ALTERNATIVES / f"{path.stem}.py"))
    return found["RIGHT"], found.get("WRONG", {})


def more_mistakes(path: Path) -> list[dict[str, str]]:
    """``MORE_WRONG`` of a chapter: further mistakes ({task id: code}, also for a task with a RIGHT answer), each
    graded in a release of its own."""
    return runpy.run_path(str(ALTERNATIVES / f"{path.stem}.py")).get("MORE_WRONG", [])


@pytest.fixture(scope="module")
def graded(tmp_path_factory, request):
    """For each chapter this run tests: its student release ("stub"), its release with the alternative answers
    ("answered") and, for the first chapter, the reference itself, graded together in one kernel
    (``assign.grade_together``: the stub release runs whole, as a student's hand-in does; the others' exercises
    run after it). Two chapters at a time (each is an nbval subprocess, mostly single-threaded: two keep both
    cores busy); each test waits only for its own chapter."""
    pool = ThreadPoolExecutor(2)

    def grade_chapter(path):
        reference = nbformat.read(path, as_version=4)
        right, wrong = alternatives(path)
        versions = {"stub": assign.make_release(reference, str(path)),
                    **{f"wrong{k}": assign.make_release(reference, str(path), answers)  # before the correct answers
                       for k, answers in enumerate(more_mistakes(path))},
                    "answered": assign.make_release(reference, str(path), {**right, **wrong})}
        if path == NOTEBOOKS[0]:
            versions["reference"] = reference
        return assign.grade_together(versions, path)

    paths = {item.callspec.params["path"] for item in request.session.items
             if getattr(item, "originalname", "") in GRADING_TESTS}  # only the chapters this run tests (-k, -m)
    jobs = {path: pool.submit(grade_chapter, path) for path in NOTEBOOKS if path in paths}
    yield jobs
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_follows_the_contract(path):
    assert build.check_file(path) == [], f"{path.name}: run python -m course.build --check"


@pytest.mark.slow
@pytest.mark.other_isa
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_student_release_fails_every_check(path, graded):
    tasks = assign.graded_tasks(nbformat.read(path, as_version=4))
    reports = graded[path].result()
    stub = reports["stub"]
    assert set(stub.tasks) == tasks
    passing = {t: r.reason for t, r in stub.tasks.items() if r.passed}
    assert not passing, f"{path.name}: these checks pass on the stub: {sorted(passing)}"
    if "reference" in reports:
        # The reference passing its own checks is what the strict nbval run of every notebook shows;
        # grading one real chapter's reference proves the grader's path too (cell matching, cwd).
        failing = {t: r.reason for t, r in reports["reference"].tasks.items() if not r.passed}
        assert set(reports["reference"].tasks) == tasks and not failing, f"{path.name}: reference fails {failing}"


@pytest.mark.slow
@pytest.mark.other_isa
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_alternative_answers_pass_and_mistakes_fail(path, graded):
    right, wrong = alternatives(path)
    tasks = assign.graded_tasks(nbformat.read(path, as_version=4))
    assert right and not set(right) & set(wrong), f"{path.name}: at least one RIGHT answer, none also WRONG"
    assert set(right) | set(wrong) <= tasks, f"{path.name}: answers for tasks it does not have"
    answered = graded[path].result()["answered"]
    assert set(answered.tasks) == tasks
    failing = {t: answered.tasks[t].reason for t in right if not answered.tasks[t].passed}
    assert not failing, f"{path.name}: correct answers in another style fail: {failing}"
    passing = sorted(t for t in tasks - set(right) if answered.tasks[t].passed)
    assert not passing, f"{path.name}: wrong answers (or stubs) pass: {passing}"
    for k, answers in enumerate(more_mistakes(path)):
        report = graded[path].result()[f"wrong{k}"]
        passing = sorted(t for t in answers if report.tasks[t].passed)
        assert not passing, f"{path.name}: the mistakes MORE_WRONG[{k}] pass: {passing}"


GRADING_TESTS = {test_student_release_fails_every_check.__name__,
                 test_alternative_answers_pass_and_mistakes_fail.__name__}


def test_every_syllabus_chapter_has_its_notebook():
    """Thirty chapters in the syllabus, thirty notebooks, the same names (the contract test above then
    checks each one's goals, sections, misconceptions, exercises, graded checks and summary)."""
    from course.syllabus import CHAPTERS

    assert [p.name for p in NOTEBOOKS] == [ch.notebook for ch in CHAPTERS]


# Tasks whose answer is still readable above them, each named so that the list can only shrink: the test fails
# for a task over the limit that is not listed, and for a listed task that is no longer over it.
SHOWN_ABOVE: dict[str, set[str]] = {}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_answer_is_shown_above_its_task(path):
    """A graded task's reference solution is not readable in the cells above it (course.answers_above)."""
    share = answers_above.shown_share(nbformat.read(path, as_version=4))
    over = {t for t, s in share.items() if s >= answers_above.LIMIT}
    listed = SHOWN_ABOVE.get(path.stem, set())
    assert over <= listed, f"{path.name}: the answers of {sorted(over - listed)} can be read above the task " \
                           f"({', '.join(f'{share[t]:.0%}' for t in sorted(over - listed))} of it shown)"
    assert listed <= over, f"{path.name}: {sorted(listed - over)} no longer shown above: take them out of SHOWN_ABOVE"


def test_answers_above_catches_a_shown_function():
    """The measure itself: a task whose solution is a function printed above it is over the limit, one
    written fresh is not."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    body = "    total = 0\n    for x in xs:\n        total += x * x\n    return total ** 0.5\n"
    shown = code("print('''def norm(self, xs):\n" + body.replace("x * x", "self.w * x * x") + "''')",
                 outputs=[nbformat.v4.new_output("stream", text="def norm(self, xs):\n" + body)])

    def task(answer):
        return code(f"def norm(xs):\n    ### BEGIN SOLUTION\n{answer}    ### END SOLUTION",
                    metadata={"tags": ["solution", "task-1.1"]})

    copied = nbformat.v4.new_notebook(cells=[md("x"), shown, task(body)])
    fresh = nbformat.v4.new_notebook(cells=[md("x"), shown, task("    return math.sqrt(sum(v ** 2 for v in xs))\n")])
    assert answers_above.shown_share(copied)["1.1"] == 1.0
    assert answers_above.shown_share(fresh)["1.1"] == 0.0
