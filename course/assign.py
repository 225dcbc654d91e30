"""Student releases and grading for the course notebooks.

The reference notebook in ``notebooks/`` holds the solutions and the expected outputs. Two
commands derive everything else from it (see ``notebooks/README.md`` for the contract)::

    python -m course.assign release NOTEBOOK... [-o release/]
    python -m course.assign grade STUDENT.ipynb... [--reference-dir notebooks/] [--json out.json]
    python -m course.assign class SUBMISSIONS/ [--csv grades.csv] [--jobs N]

(also installed as ``zero-lab-release`` and ``zero-lab-grade``). ``class`` grades a whole class:
``SUBMISSIONS/<student>/chNN_<slug>.ipynb``, one folder per student, and prints one row per student
with every task of every chapter that has a reference; a notebook not handed in fails its tasks.

Grading runs nbval on a copy of the student's notebook in which every graded cell is the
reference's cell (source *and* stored output), so a student cannot edit a check: a task
passes iff its graded cells run without error and print what the reference printed. A notebook of a
language edition (its metadata ``language``, e.g. ``zh``) is graded against that edition's reference,
``notebooks/<lang>/``, in a kernel that speaks the language (course.i18n); its stubs raise in it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
TASK_TAG = re.compile(r"^task-(\d+)\.(\d+)$")
REPO = Path(__file__).resolve().parents[1]
SANITIZE = REPO / "course" / "nbval_sanitize.cfg"
CELL_TIMEOUT = 300  # seconds, as in course.build
# nbval's own per-cell controls: a student must not switch checks off in their copy.
NBVAL_TAGS = {"nbval-ignore-output", "nbval-check-output", "nbval-skip",
              "nbval-raises-exception", "raises-exception"}


class NotebookError(ValueError):
    """A notebook breaks the contract; the message names the file and the cell."""


# --- cells and markers ----------------------------------------------------------------------

def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def task_ids(cell) -> list[str]:
    """Task ids "N.M" from the cell's ``task-N.M`` tags."""
    return [f"{m[1]}.{m[2]}" for t in tags(cell) if (m := TASK_TAG.match(t))]


def graded_tasks(nb) -> set[str]:
    """The task ids that ``nb`` grades."""
    return {t for c in nb.cells if "graded" in tags(c) for t in task_ids(c)}


def _task_key(task: str):
    """Sort "2.10" after "2.9"."""
    return tuple(int(x) for x in task.split("."))


def where(cell, index: int) -> str:
    return f"cell {index} (id {cell.get('id', '?')})"


def solution_regions(source: str) -> list[tuple[int, int]]:
    """(begin, end) line numbers of each ``### BEGIN/END SOLUTION`` region, 0-based.

    Raises ValueError for a BEGIN without END, an END without BEGIN, or nested regions.
    """
    regions, begin = [], None
    for i, line in enumerate(source.splitlines()):
        text = line.strip()
        if text.startswith(BEGIN):
            if begin is not None:
                raise ValueError(f"nested {BEGIN} on line {i + 1} "
                                 f"(region opened on line {begin + 1})")
            begin = i
        elif text.startswith(END):
            if begin is None:
                raise ValueError(f"{END} on line {i + 1} without {BEGIN}")
            regions.append((begin, i))
            begin = None
    if begin is not None:
        raise ValueError(f"{BEGIN} on line {begin + 1} has no {END}")
    return regions


# --- release --------------------------------------------------------------------------------

def make_release(nb, name: str = "notebook", answers: dict[str, str] | None = None):
    """Student copy of a reference notebook: solution regions become
    ``raise NotImplementedError("Task N.M")`` at the region's indentation; outputs cleared.

    ``answers`` maps task ids to code that a student might write instead (indented like the
    region): a release with some tasks answered, to show that a correct answer in another style passes."""
    nb = copy.deepcopy(nb)
    answers = dict(answers or {})
    unknown = set(answers) - {t for c in nb.cells if "solution" in tags(c) for t in task_ids(c)}
    if unknown:
        raise NotebookError(f"{name}: no solution cell for task(s) {sorted(unknown)}")
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        try:
            regions = solution_regions(cell.source)
        except ValueError as e:
            raise NotebookError(f"{name}: {where(cell, i)}: {e}") from None
        is_solution = "solution" in tags(cell)
        if regions and not is_solution:
            raise NotebookError(f"{name}: {where(cell, i)} has solution markers "
                                "but no 'solution' tag")
        if is_solution:
            ids = task_ids(cell)
            if len(ids) != 1:
                raise NotebookError(f"{name}: {where(cell, i)}: a solution cell needs exactly one "
                                    f"task-N.M tag, found {ids or 'none'}")
            if not regions:  # without markers the whole answer would ship to students
                raise NotebookError(f"{name}: {where(cell, i)}: solution cell has no "
                                    f"{BEGIN} region")
            lines = cell.source.splitlines()
            answer = answers.get(ids[0])
            if answer is not None and len(regions) != 1:
                raise NotebookError(f"{name}: {where(cell, i)}: an answer replaces one solution region, "
                                    f"task {ids[0]} has {len(regions)}")
            for begin, end in reversed(regions):
                indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
                stub = [f'raise NotImplementedError({json.dumps(task_message(nb, ids[0]), ensure_ascii=False)})'] if answer is None \
                    else answer.splitlines()
                lines[begin:end + 1] = [indent + line if line.strip() else "" for line in stub]
            cell.source = "\n".join(lines)
        cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)  # widget state belongs to the cleared outputs
    return nb


def language(nb) -> str:
    """The notebook's language: an edition's (course/edition.py sets it), else English."""
    return nb.metadata.get("language", "en")


def task_message(nb, task: str) -> str:
    """The stub's message, "Task N.M" in the notebook's language (the gettext catalog of course.i18n)."""
    from course.i18n import translations
    return translations(language(nb)).gettext("Task {task}").format(task=task)


def default_reference(student_path) -> Path:
    """The reference a student notebook is graded against: the same name in notebooks/, or in
    notebooks/<lang>/ for a notebook of a language edition."""
    student_path = Path(student_path)
    try:
        lang = language(nbformat.read(student_path, as_version=4))
    except Exception:  # an unreadable hand-in is graded (as zero) against the English reference
        lang = "en"
    edition = REPO / "notebooks" / lang / student_path.name
    return edition if lang != "en" and edition.exists() else REPO / "notebooks" / student_path.name


def release(paths, outdir="release") -> list[Path]:
    """Write the student release of each reference notebook into ``outdir``, same names."""
    outdir, paths = Path(outdir), [Path(p) for p in paths]
    # All or nothing: one malformed notebook must not leave a half-written release.
    students = [make_release(nbformat.read(p, as_version=4), name=str(p)) for p in paths]
    outdir.mkdir(parents=True, exist_ok=True)
    for path, student in zip(paths, students):
        nbformat.write(student, outdir / path.name)
    return [outdir / p.name for p in paths]


def workspace(paths, outdir="work") -> tuple[list[Path], list[Path]]:
    """A student's own copy of the course: the release of each chapter not in ``outdir`` yet.

    A notebook already there is the student's work and is never touched, so running it again only
    adds chapters. Returns (written, kept)."""
    outdir, paths = Path(outdir), [Path(p) for p in paths]
    missing = [p for p in paths if not (outdir / p.name).exists()]
    written = release(missing, outdir) if missing else []
    return written, [outdir / p.name for p in paths if p not in missing]


# --- grading --------------------------------------------------------------------------------

@dataclass
class TaskResult:
    passed: bool
    reason: str = ""  # last line of the failure: "NotImplementedError: Task 2.1", ...


@dataclass
class GradeReport:
    student: str
    reference: str
    tasks: dict[str, TaskResult] = field(default_factory=dict)

    @property
    def points(self) -> int:
        return sum(r.passed for r in self.tasks.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "points": self.points}


def grading_notebook(student, reference, folder: str | os.PathLike):
    """The notebook nbval runs, and the task ids of each of its code cells (by code index).

    Cell 0 changes into ``folder`` so that relative paths resolve as in the reference.
    Every cell graded in the reference replaces its student counterpart (same cell id, else
    the next student cell tagged ``graded`` with the same task), or is inserted after the
    student's last cell of that task. All other cells are the student's, outputs cleared.
    """
    ids = {c.get("id"): i for i, c in enumerate(student.cells) if c.get("id")}
    replace, insert = {}, []  # student index -> graded cell; (after index, graded cell)
    for j, ref in enumerate(reference.cells):
        if "graded" not in tags(ref):
            continue
        if ref.execution_count is None:
            raise NotebookError(f"reference {where(ref, j)}: graded cell has no stored output; "
                                "rebuild it with python -m course.build")
        graded = copy.deepcopy(ref)
        graded.metadata["tags"] = tags(ref) + ["nbval-check-output"]
        same_task = [i for i, c in enumerate(student.cells) if i not in replace
                     and "graded" in tags(c) and task_ids(c) == task_ids(ref)]
        i = ids.get(ref.get("id"))
        i = i if i is not None and i not in replace else (same_task or [None])[0]
        if i is None:  # the student deleted it: put it back after their work on the task
            of_task = [k for k, c in enumerate(student.cells)
                       if set(task_ids(c)) & set(task_ids(ref))]
            insert.append((of_task[-1] if of_task else None, graded))
        else:
            replace[i] = graded
    cells = []
    for i, cell in enumerate(student.cells):
        cells.append(replace.get(i) or _cleared(cell))
        cells += [g for after, g in insert if after == i]
    cells += [g for after, g in insert if after is None]
    setup = nbformat.v4.new_code_cell(f"import os\nos.chdir({str(folder)!r})")
    nb = nbformat.v4.new_notebook(cells=[setup, *cells], metadata=copy.deepcopy(reference.metadata))
    return nb, [task_ids(c) for c in nb.cells if c.cell_type == "code"]


def _cleared(cell):
    cell = copy.deepcopy(cell)
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
        cell.metadata["tags"] = [t for t in tags(cell) if t not in NBVAL_TAGS]
    return cell


# Colour codes in IPython tracebacks; junit XML spells ESC as "#x1B".
ANSI = re.compile(r"(\x1b|#x1B)\[[0-9;]*[A-Za-z]")


def failure_reason(text: str) -> str:
    """One line from nbval's failure report: the exception's last line, or what differs."""
    lines = [ln.strip() for ln in ANSI.sub("", text).splitlines() if ln.strip()]
    if any("Cell outputs differ" in ln for ln in lines):
        after = lines[lines.index("Traceback:") + 1:] if "Traceback:" in lines else []
        # nbval: "mismatch 'stdout'", then pytest's "'<reference>' == '<student>'"
        what = after[0] if after else ""
        diff = next((ln for ln in after if " == " in ln and not ln.startswith("assert")), "")
        if "' == '" in diff:
            want, got = diff.split("' == '", 1)
            diff = f"expected {want}', got '{got}"
        return f"output differs from the reference: {what}" + (f": {diff}" if diff else "")
    return lines[-1] if lines else "failed"


def _run_nbval(nb_path: Path, cwd: Path, timeout: float, lang: str = "en") -> dict[int, str | None]:
    """Run nbval (lax) on ``nb_path`` in a kernel speaking ``lang``; {code cell index: None if passed, else reason}."""
    junit = nb_path.with_suffix(".xml")
    ini = nb_path.parent / "pytest.ini"
    ini.write_text("[pytest]\n")  # hermetic: no project addopts or conftest from elsewhere
    cmd = [sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(nb_path.parent),
           "-p", "nbval.plugin", "-p", "no:cacheprovider", "--color=no", "-q",
           "--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={CELL_TIMEOUT}",
           "--nbval-sanitize-with", str(SANITIZE), f"--junitxml={junit}", str(nb_path)]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    # Only nbval: other plugins cost seconds of start-up and could change the run.
    env |= {"PYTHONHASHSEED": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "ZERO_LAB_LANG": lang}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if not junit.exists():
        raise RuntimeError(f"nbval did not run:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    results = {}
    for case in ET.parse(junit).iter("testcase"):
        m = re.fullmatch(r"Cell (\d+)", case.get("name", ""))  # nbval counts code cells only
        if not m:
            continue
        bad = next((e for e in case if e.tag in ("failure", "error", "skipped")), None)
        if bad is None:
            results[int(m[1])] = None
        else:  # the message attribute is truncated; "skipped" (xfail after a timeout) has no text
            detail = bad.get("message", "") if bad.tag == "skipped" else bad.text
            results[int(m[1])] = failure_reason(detail or bad.get("message", ""))
    return results


def _task_results(report: GradeReport, code: list, cell_tasks: list[list[str]], results: dict) -> GradeReport:
    """Fill ``report`` from nbval's per-cell results: a task passes iff its graded cells pass; a failed task
    gives the first failing cell of the task as its reason (so a stub that raises in the solution cell is
    named as such)."""
    for task in sorted({t for ids in cell_tasks for t in ids}, key=_task_key):
        cells = [n for n, ids in enumerate(cell_tasks) if task in ids]
        graded = [n for n in cells if "nbval-check-output" in tags(code[n])]
        if not graded:
            continue  # a task tag the reference does not grade
        missing = "not run (nbval stopped before this cell)"
        if all(results.get(n, missing) is None for n in graded):
            report.tasks[task] = TaskResult(True)
        else:
            first = next(n for n in cells if results.get(n, missing) is not None)
            report.tasks[task] = TaskResult(False, results.get(first, missing))
    return report


def _run_cells(nb, name: str, folder: Path, timeout: float, lang: str = "en") -> dict[int, str | None]:
    n_code = sum(c.cell_type == "code" for c in nb.cells)
    with tempfile.TemporaryDirectory(prefix="zero-lab-grade-") as tmp:
        path = Path(tmp) / name
        nbformat.write(nb, path)
        try:
            return _run_nbval(path, folder, timeout, lang)
        except subprocess.TimeoutExpired:
            return {n: f"grading timed out after {timeout:g} s" for n in range(n_code)}


def grade(student_path, reference_path=None, timeout: float = 900) -> GradeReport:
    """Grade one student notebook against its reference (default: ``default_reference``)."""
    student_path = Path(student_path)
    reference_path = Path(reference_path or default_reference(student_path))
    reference = nbformat.read(reference_path, as_version=4)
    report = GradeReport(str(student_path), str(reference_path))
    try:
        student = nbformat.read(student_path, as_version=4)
    except Exception as e:  # a broken hand-in scores zero; it must not stop a batch
        for task in sorted(graded_tasks(reference), key=_task_key):
            report.tasks[task] = TaskResult(False, f"cannot read the notebook: {e}")
        return report
    folder = reference_path.resolve().parent
    nb, cell_tasks = grading_notebook(student, reference, folder)
    results = _run_cells(nb, student_path.name, folder, timeout, language(reference))
    return _task_results(report, [c for c in nb.cells if c.cell_type == "code"], cell_tasks, results)


def exercises_start(nb) -> int:
    """Index of the first code cell that belongs to a task (a task tag or a solution region)."""
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                and (task_ids(c) or (BEGIN in c.source)))


def grade_together(releases: dict, reference_path, timeout: float = 1800) -> dict[str, GradeReport]:
    """Grade several versions of one chapter (name → student notebook) in one kernel, for the course's own
    checks: the first version runs whole, exactly as ``grade`` runs it; each further version's exercises
    (from its first task cell on, graded cells the reference's) then run again after it, on the state the
    chapter's body left. The body, most of a chapter's run time, runs once instead of once per version.
    Order the versions stub first and correct answers last: a later version's cell that raises before it
    defines its answer leaves an earlier version's definition in place, which must then be a stub (or a
    mistake), never a solution; so a leftover can make a task fail, never pass."""
    reference_path = Path(reference_path)
    reference = nbformat.read(reference_path, as_version=4)
    folder = reference_path.resolve().parent
    cells, spans = [], {}  # name -> (first code cell index, code cells, their task ids)
    for k, (name, student) in enumerate(releases.items()):
        nb, cell_tasks = grading_notebook(student, reference, folder)
        part = nb.cells if k == 0 else nb.cells[exercises_start(nb):]
        for c in part if k else ():  # a cell id appears once per notebook
            if c.get("id"):
                c.id = f"v{k}-{c.id}"[:64]
        code = [c for c in part if c.cell_type == "code"]
        spans[name] = (sum(c.cell_type == "code" for c in cells), code, cell_tasks[len(cell_tasks) - len(code):])
        cells += part
    combined = nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(reference.metadata))
    results = _run_cells(combined, reference_path.name, folder, timeout, language(reference))
    return {name: _task_results(GradeReport(name, str(reference_path)), code, cell_tasks,
                                {n - first: r for n, r in results.items() if first <= n < first + len(code)})
            for name, (first, code, cell_tasks) in spans.items()}


# --- command line ---------------------------------------------------------------------------

def format_table(reports: list[GradeReport]) -> str:
    """One row per student: ✓/✗ per task, then points; failure reasons listed below."""
    tasks = sorted({t for r in reports for t in r.tasks}, key=_task_key)
    rows = [["student", *tasks, "points"]]
    for r in reports:
        marks = ["✓" if r.tasks[t].passed else "✗" if t in r.tasks else "·" for t in tasks]
        rows.append([r.student, *marks, f"{r.points}/{len(r.tasks)}"])
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    for r in reports:
        lines += [f"{r.student} task {t}: {res.reason}"
                  for t, res in sorted(r.tasks.items(), key=lambda kv: _task_key(kv[0]))
                  if not res.passed]
    return "\n".join(lines)


def release_main(argv=None, prog="zero-lab-release") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Write the student release of notebooks.")
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK")
    p.add_argument("-o", "--output-dir", default="release", help="default: release/")
    args = p.parse_args(argv)
    try:
        for path in release(args.notebooks, args.output_dir):
            print(f"wrote {path}")
    except NotebookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def workspace_main(argv=None, prog="zero-lab-workspace") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Add the student release of every chapter not in "
                                "the workspace yet; notebooks already there (your work) are kept as they are.")
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK")
    p.add_argument("-o", "--output-dir", default="work", help="default: work/")
    args = p.parse_args(argv)
    try:
        written, kept = workspace(args.notebooks, args.output_dir)
    except NotebookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.output_dir}/: {len(written)} chapter(s) added, {len(kept)} of yours kept unchanged")
    return 0


def grade_main(argv=None, prog="zero-lab-grade") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Grade student notebooks against the "
                                "reference notebook of the same file name.")
    p.add_argument("students", nargs="+", metavar="STUDENT.ipynb")
    p.add_argument("--reference-dir", default=None,
                   help="default: the repository's notebooks/ (notebooks/<lang>/ for an edition's notebook)")
    p.add_argument("--json", metavar="OUT.json", help="also write the reports as JSON")
    p.add_argument("--timeout", type=float, default=900, help="seconds per notebook (900)")
    args = p.parse_args(argv)
    reports = []
    for student in args.students:
        try:
            reference = Path(args.reference_dir) / Path(student).name if args.reference_dir else None
            reports.append(grade(student, reference, args.timeout))
        except (OSError, NotebookError, RuntimeError) as e:  # e.g. no such reference notebook
            print(f"error: {student}: {e}", file=sys.stderr)
    if not reports:
        return 1
    print(format_table(reports))
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in reports], indent=1,
                                              ensure_ascii=False) + "\n")
    return 0  # grading ran; the table carries the results


def grade_class(root, reference_dir=None, timeout: float = 900, jobs: int = 1) -> list[GradeReport]:
    """One report per student folder under ``root``, merging all their chapters' tasks. Each notebook is
    graded against ``reference_dir``'s of its name, by default ``default_reference`` (a class may mix editions).

    The chapters graded are those any student handed in; a student missing one of them fails its
    tasks with the reason "not handed in", so every row has the same columns.
    """
    from concurrent.futures import ThreadPoolExecutor

    pick = reference_dir is None
    root, reference_dir = Path(root), Path(reference_dir or REPO / "notebooks")
    students = sorted(p for p in root.iterdir() if p.is_dir())
    if not students:
        raise NotebookError(f"{root}: no student folders (expected {root}/<student>/chNN_<slug>.ipynb)")
    chapters = sorted({nb.name for s in students for nb in s.glob("*.ipynb") if (reference_dir / nb.name).exists()})
    if not chapters:
        raise NotebookError(f"{root}: no handed-in notebook matches a reference in {reference_dir}")
    jobs_list = [(s, name) for s in students for name in chapters if (s / name).exists()]
    with ThreadPoolExecutor(max(1, jobs)) as pool:  # each grade is an nbval subprocess
        done = dict(zip(jobs_list, pool.map(lambda j: grade(j[0] / j[1], None if pick else reference_dir / j[1], timeout), jobs_list)))
    reports = []
    for s in students:
        merged = GradeReport(s.name, str(reference_dir))
        for name in chapters:
            if (s, name) in done:
                merged.tasks.update(done[s, name].tasks)
            else:
                ref = nbformat.read(reference_dir / name, as_version=4)
                merged.tasks.update({t: TaskResult(False, f"not handed in: {name}") for t in graded_tasks(ref)})
        reports.append(merged)
    return reports


def write_csv(reports: list[GradeReport], path) -> None:
    """student, one column per task (1 or 0), points: a spreadsheet's grade book."""
    import csv

    tasks = sorted({t for r in reports for t in r.tasks}, key=_task_key)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["student", *tasks, "points", "max"])
        for r in reports:
            w.writerow([r.student, *(int(r.tasks[t].passed) if t in r.tasks else 0 for t in tasks),
                        r.points, len(tasks)])


def class_main(argv=None, prog="zero-lab-grade-class") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Grade a class: SUBMISSIONS/<student>/chNN_<slug>.ipynb.")
    p.add_argument("submissions", metavar="SUBMISSIONS_DIR")
    p.add_argument("--reference-dir", default=None,
                   help="default: the repository's notebooks/ (notebooks/<lang>/ for an edition's notebook)")
    p.add_argument("--csv", metavar="OUT.csv", help="also write the grade book as CSV")
    p.add_argument("--json", metavar="OUT.json", help="also write the reports as JSON")
    p.add_argument("--jobs", type=int, default=1, help="notebooks graded at once (default 1)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per notebook (900)")
    args = p.parse_args(argv)
    try:
        reports = grade_class(args.submissions, args.reference_dir, args.timeout, args.jobs)
    except (OSError, NotebookError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(format_table(reports))
    if args.csv:
        write_csv(reports, args.csv)
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in reports], indent=1, ensure_ascii=False) + "\n")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = {"release": release_main, "workspace": workspace_main, "grade": grade_main, "class": class_main}
    if not argv or argv[0] not in commands:
        print("usage: python -m course.assign {release,workspace,grade,class} ...", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:], prog=f"python -m course.assign {argv[0]}")


if __name__ == "__main__":
    sys.exit(main())
