"""Build and check the chapter notebooks (the reference: solutions + expected outputs).

    python -m course.build [NOTEBOOK ...]          # syllabus title cell, execute, normalise
    python -m course.build --check [NOTEBOOK ...]  # verify the contract, execute nothing
    python -m course.build --new N                 # write notebooks/chNN_slug.ipynb (template)
    python -m course.build --lang zh [NOTEBOOK ...]  # write the Chinese edition (course/edition.py)

Default: every ``notebooks/ch*.ipynb``. The contract is written down in notebooks/README.md.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbformat.v4.nbbase import random_cell_id

from course import edition
from course.assign import BEGIN, END, solution_regions, tags, task_ids, where
from course.syllabus import chapter, title_markdown

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SECTIONS = ("Concept", "Code", "Picture", "Common misconceptions", "Exercises", "Summary")
NAME = re.compile(r"^ch(\d{2})_(.+)\.ipynb$")
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
CELL_TIMEOUT = 300


class BuildError(Exception):
    """A notebook cannot be built or checked; the message names the file."""


def chapter_for(path: Path):
    """The syllabus chapter of ``notebooks/chNN_<slug>.ipynb`` (number and slug must match)."""
    m = NAME.match(path.name)
    if not m:
        raise BuildError(f"{path}: name must be chNN_<slug>.ipynb")
    try:
        ch = chapter(int(m[1]))
    except (LookupError, ValueError) as e:
        raise BuildError(f"{path}: chapter {int(m[1])} is not in the syllabus ({e})") from None
    if ch.slug != m[2]:
        raise BuildError(f"{path}: slug {m[2]!r} does not match the syllabus: {ch.notebook}")
    return ch


def title_cell(ch):
    return nbformat.v4.new_markdown_cell(title_markdown(ch), id="title",
                                         metadata={"tags": ["syllabus"]})


def set_title(nb, ch):
    """Make cell 0 the generated title cell (replacing an old one, else inserting it)."""
    if nb.cells and "syllabus" in tags(nb.cells[0]):
        cell = title_cell(ch)
        cell.id = nb.cells[0].get("id", cell.id)  # ids stay stable across builds
        nb.cells[0] = cell
    else:
        nb.cells.insert(0, title_cell(ch))
    return nb


def problems(nb, number: int, title: str | None, executed: bool = True) -> list[str]:
    """Contract violations of one notebook. ``title`` None skips the title comparison;
    ``executed`` also requires stored output in graded cells (what the grader compares)."""
    found = []
    first = nb.cells[0] if nb.cells else None
    if first is None or first.cell_type != "markdown" or "syllabus" not in tags(first):
        found.append("cell 0 is not the markdown title cell tagged 'syllabus'")
    elif title is not None and first.source != title:
        found.append("cell 0 differs from the syllabus title (run python -m course.build)")
    headings = [line[3:].strip() for c in nb.cells[1:] if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("## ")]
    order = [h for h in headings if h in SECTIONS]
    for s in SECTIONS:
        if s not in order:
            found.append(f"missing section heading '## {s}'")
    if all(s in order for s in SECTIONS) and sorted(set(order), key=order.index) != list(SECTIONS):
        found.append(f"section headings out of order: {sorted(set(order), key=order.index)}")
    graded, solved = set(), set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "getsource" in cell.source:  # hand-cut excerpts go wrong silently
            found.append(f"{where(cell, i)}: show library code with course.show, not inspect.getsource")
        kind = [k for k in ("graded", "solution") if k in tags(cell)]
        if not kind:
            continue
        ids = task_ids(cell)
        if not ids or any(int(t.split(".")[0]) != number for t in ids):
            found.append(f"{where(cell, i)}: {kind[0]} cell needs a task-{number}.M tag, "
                         f"has {tags(cell)}")
        (graded if "graded" in kind else solved).update(ids)
        if "solution" in kind:
            try:
                if not solution_regions(cell.source):
                    found.append(f"{where(cell, i)}: solution cell has no {BEGIN} ... {END}")
            except ValueError as e:
                found.append(f"{where(cell, i)}: {e}")
        if "graded" in kind and re.search(r"NBVAL_(IGNORE_OUTPUT|SKIP)", cell.source):
            found.append(f"{where(cell, i)}: a graded cell's output must be checked")
        if "graded" in kind and re.search(r"(?<![\w.])print\(", cell.source):
            found.append(f"{where(cell, i)}: a graded cell prints through course.canon.echo, not print "
                         "(so that equal values print the same on every CPU)")
        if "graded" in kind and executed and cell.execution_count is None:
            found.append(f"{where(cell, i)}: graded cell was not executed "
                         "(run python -m course.build)")
    if not graded:
        found.append("no graded cell")
    found += [f"task {t} has a solution cell but no graded cell" for t in sorted(solved - graded)]
    return found


def check_file(path: Path) -> list[str]:
    try:
        ch = chapter_for(path)
        return problems(nbformat.read(path, as_version=4), ch.number, title_markdown(ch))
    except BuildError as e:
        return [str(e).removeprefix(f"{path}: ")]


def execute(nb, folder: Path):
    """Run every cell in a fresh ``python3`` kernel started in ``folder``; return ``nb``."""
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(folder)}})
    client.execute(env=os.environ | {"PYTHONHASHSEED": "0"})  # hash order is part of outputs
    return nb


def normalise(nb):
    """Keep diffs small: fixed kernelspec, no timestamps, every cell with an id (kept once set)."""
    nb.nbformat, nb.nbformat_minor = 4, max(nb.nbformat_minor, 5)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.setdefault("id", random_cell_id())
    return nb


def build_file(path: Path) -> None:
    ch = chapter_for(path)
    nb = set_title(nbformat.read(path, as_version=4), ch)
    found = problems(nb, ch.number, None, executed=False)
    if found:
        raise BuildError(f"{path}: " + "; ".join(found))
    try:
        execute(normalise(nb), path.resolve().parent)
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        raise BuildError(f"{path}: a cell failed:\n{e}") from None
    nbformat.write(normalise(nb), path)


def new_notebook(n: int):
    """Template for chapter ``n``: title, the section headings, one example exercise pair."""
    ch = chapter(n)
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    task = f"{n}.1"
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": dict(KERNELSPEC)})
    nb.cells = [
        title_cell(ch),
        md("## Concept\n\nWhat this chapter explains, in prose and formulas.", id="concept"),
        md("## Code\n\nReal code from the public API of `zero_ref` / `sim`.", id="code"),
        md("## Picture\n\nA plot, timeline or widget drawn from the code above.", id="picture"),
        md("## Common misconceptions\n\n- ...", id="misconceptions"),
        md(f"## Exercises\n\n**Task {task}.** Write `adam_state_bytes(n_params)`: the bytes of "
           "fp32 Adam state (momentum and variance) for `n_params` parameters.", id="exercises"),
        code("def adam_state_bytes(n_params):\n"
             f"    {BEGIN}\n    return 2 * 4 * n_params\n    {END}",
             id=f"task-{n}-1-solution", metadata={"tags": ["solution", f"task-{task}"]}),
        code("# Graded: prints through course.canon (the same text on every CPU), asserts against an\n"
             "# independent computation.\n"
             "import struct\n"
             "from course.canon import echo\n"
             "echo(adam_state_bytes(7_000_000_000) / 2**30, \"GiB\", digits=4)\n"
             "assert adam_state_bytes(1000) == 2 * struct.calcsize('f') * 1000, 'two fp32 tensors'",
             id=f"task-{n}-1-graded", metadata={"tags": ["graded", f"task-{task}"]}),
        md("## Summary\n\n- ...", id="summary"),
    ]
    return nb


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.build", description=__doc__.split("\n")[0])
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", type=Path)
    p.add_argument("--check", action="store_true", help="verify only; execute nothing")
    p.add_argument("--new", type=int, metavar="N", help="write the template for chapter N")
    p.add_argument("--lang", choices=("zh",), help="write that edition from its translations (one whose code "
                   "cells are translated is executed in its language: course/edition.py)")
    args = p.parse_args(argv)
    if args.lang:
        return edition.main(["build", *map(str, args.notebooks), "--lang", args.lang])
    if args.new is not None:
        try:
            path = NOTEBOOKS / chapter(args.new).notebook
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if path.exists():
            print(f"{path} exists; not overwritten", file=sys.stderr)
            return 1
        nbformat.write(new_notebook(args.new), path)
        print(f"wrote {path}")
        return 0
    paths = args.notebooks or sorted(NOTEBOOKS.glob("ch*.ipynb"))
    failed = 0
    for path in paths:
        try:
            found = check_file(path) if args.check else []
            if not args.check:
                build_file(path)
        except (BuildError, OSError, ValueError) as e:  # ValueError: not a notebook (bad JSON)
            found = [str(e).removeprefix(f"{path}: ")]
        for problem in found:
            print(f"{path}: {problem}", file=sys.stderr)
        failed += bool(found)
        if not found and not args.check:
            print(f"built {path}")
    if args.check and not failed:
        print(f"{len(paths)} notebook(s) follow the contract")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
