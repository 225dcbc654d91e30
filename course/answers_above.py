"""Is a graded task's answer readable above it? The share of the reference solution already shown.

A student release shows the code of every cell above a task, and running those cells prints what the
reference printed (``course.show`` prints library source). A task whose solution can be read there is
re-typing, not building. ``shown_share`` measures it: the solution's code as tokens (comments and
``self`` dropped, so a method shown in the library and re-typed as a function still matches), cut into
runs of ``RUN`` tokens; the share is the fraction of those runs that occur in the code or the stored
output of a cell above the task. A share of ``LIMIT`` or more fails the contract.

    python -m course.answers_above [NOTEBOOK ...]     # every task's share, the ones over the limit marked
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

from course.assign import make_release, solution_regions, tags, task_ids

RUN = 5        # tokens per run: long enough that shared idioms (`for i in range(n)`) rarely match alone
LIMIT = 0.5    # half the solution's runs shown above: it was copied, not built
TOKEN = re.compile(r"[A-Za-z_]\w*|\d+\.?\d*|\*\*|//|[-+*/%()<>=!\[\]{}.,:]")


def runs(text: str) -> set[tuple[str, ...]]:
    """The runs of RUN consecutive tokens of ``text``, comments and ``self`` left out."""
    tokens = [t for line in text.splitlines() for t in TOKEN.findall(line.split("#", 1)[0]) if t != "self"]
    return {tuple(tokens[i:i + RUN]) for i in range(len(tokens) - RUN + 1)}


def _printed(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    return data.get("text/plain", "") + re.sub(r"<[^>]+>", " ", data.get("text/html", ""))


def shown_share(nb) -> dict[str, float]:
    """{task id: share of its solution's runs shown above it} for every solution cell of a reference notebook."""
    release = make_release(nb)
    shown: set = set()
    share = {}
    for ref, student in zip(nb.cells, release.cells):
        if ref.cell_type != "code":
            continue
        if "solution" in tags(ref):
            lines = ref.source.splitlines()
            answer = runs("\n".join(line for b, e in solution_regions(ref.source) for line in lines[b + 1:e]))
            share[task_ids(ref)[0]] = len(answer & shown) / len(answer) if answer else 0.0
        shown |= runs(student.source)  # what the student's copy shows: stubs in place of answers
        for output in ref.get("outputs", []):
            shown |= runs(_printed(output))
    return share


def main(argv=None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])] or sorted(
        Path(__file__).resolve().parents[1].joinpath("notebooks").glob("ch*.ipynb"))
    over = 0
    for path in paths:
        for task, s in shown_share(nbformat.read(path, as_version=4)).items():
            over += s >= LIMIT
            print(f"{path.stem:32s} task {task:6s} {s:6.1%}{'  shown above' if s >= LIMIT else ''}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
