"""Editions of the course in other languages, from one source: the English notebooks.

    python -m course.edition status [--lang zh]            # per chapter: translated, stale, missing cells
    python -m course.edition todo NOTEBOOK [--lang zh]     # add what a translation lacks, marked "todo"
    python -m course.edition build [NOTEBOOK ...] [--lang zh]   # write notebooks/zh/chNN_<slug>.ipynb
    python -m course.build --lang zh                        # the same build

The English notebook is the reference: its code cells, outputs and graded checks are the edition's,
unchanged. Only markdown cells are translated. Each one's translation lives in
``course/i18n/<lang>/chNN_<slug>.md``, under a marker naming the cell id and a hash of the English
source it translates::

    <!-- cell b6aeea02 · en 3f0c9a1b2d4e -->
    ### 同一个内核体搬到 GPU 上：`numba.cuda` 与 CUDA C++
    ...

When the English cell changes, its hash no longer matches: the translation is *stale*, and building
the edition (and ``tests/course/test_edition.py``) fails and names the cell, so an edition never silently
drifts from the reference. A marker ending in ``· todo`` holds text still to be translated (``todo``
writes the English there); it counts as missing.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course.syllabus import readme_table

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
I18N = ROOT / "course" / "i18n"
LANGS = ("zh",)
MARKER = re.compile(r"^<!-- cell (\S+) · en ([0-9a-f]{12})( · todo)? -->$")
HEADER = "<!-- {lang} edition of notebooks/{notebook}: its markdown cells, by cell id (course/edition.py) -->"


class EditionError(Exception):
    """A translation is missing, stale or malformed; the message names the file and the cells."""


def _rel(path: Path) -> Path:
    path = Path(path)
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def source_hash(text: str) -> str:
    """The English cell's fingerprint: 12 hex digits of sha256 over its source, trailing space dropped."""
    return hashlib.sha256(text.rstrip().encode()).hexdigest()[:12]


@dataclass
class Entry:
    cell_id: str
    en_hash: str
    text: str
    todo: bool = False


@dataclass
class Status:
    notebook: str
    markdown: int = 0                                   # markdown cells in the English notebook
    translated: list = field(default_factory=list)
    stale: list = field(default_factory=list)           # the English changed since the translation
    missing: list = field(default_factory=list)         # no translation, or marked todo
    orphans: list = field(default_factory=list)         # translations of cells the notebook no longer has

    @property
    def complete(self) -> bool:
        return not (self.stale or self.missing or self.orphans)


def translation_path(notebook: str | Path, lang: str = "zh") -> Path:
    return I18N / lang / (Path(notebook).stem + ".md")


def edition_path(notebook: str | Path, lang: str = "zh") -> Path:
    return NOTEBOOKS / lang / Path(notebook).name


def parse(path: Path) -> dict[str, Entry]:
    """The entries of a translation file, by cell id (a cell twice is an error)."""
    entries: dict[str, Entry] = {}
    current: Entry | None = None
    lines: list[str] = []

    def close():
        if current is not None:
            current.text = "\n".join(lines).strip("\n")
            if current.cell_id in entries:
                raise EditionError(f"{path}: cell {current.cell_id} is translated twice")
            entries[current.cell_id] = current

    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = MARKER.match(line)
        if m:
            close()
            current, lines = Entry(m[1], m[2], "", bool(m[3])), []
        elif current is not None:
            lines.append(line)
        elif line.strip() and not line.startswith("<!--"):
            raise EditionError(f"{path}:{n}: text before the first cell marker")
    close()
    return entries


def markdown_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "markdown"]


def status(notebook: Path, lang: str = "zh") -> Status:
    nb = nbformat.read(notebook, as_version=4)
    path = translation_path(notebook, lang)
    entries = parse(path) if path.exists() else {}
    st = Status(notebook.name, markdown=len(markdown_cells(nb)))
    ids = set()
    for cell in markdown_cells(nb):
        ids.add(cell.id)
        e = entries.get(cell.id)
        if e is None or e.todo or not e.text.strip():
            st.missing.append(cell.id)
        elif e.en_hash != source_hash(cell.source):
            st.stale.append(cell.id)
        else:
            st.translated.append(cell.id)
    st.orphans = sorted(set(entries) - ids)
    return st


def compose(notebook: Path, lang: str = "zh"):
    """The edition of ``notebook``: the English one with each markdown cell's source translated."""
    st = status(notebook, lang)
    if not st.complete:
        parts = [f"{name}: {', '.join(ids)}" for name, ids in
                 (("stale (the English changed since)", st.stale), ("missing", st.missing),
                  ("no such cell", st.orphans)) if ids]
        raise EditionError(f"{_rel(translation_path(notebook, lang))}: " + "; ".join(parts)
                           + f" (python -m course.edition todo {_rel(notebook)} --lang {lang})")
    entries = parse(translation_path(notebook, lang))
    nb = nbformat.read(notebook, as_version=4)
    for cell in markdown_cells(nb):
        cell.source = entries[cell.id].text
    nb.metadata["language"] = lang
    nb.metadata["edition_of"] = f"../{notebook.name}"
    return nb


def translated_notebooks(lang: str = "zh") -> list[Path]:
    """The English notebooks that have a translation file in ``lang``."""
    folder = I18N / lang
    return [NOTEBOOKS / (p.stem + ".ipynb") for p in sorted(folder.glob("ch*.md"))] if folder.exists() else []


def build(notebooks: list[Path] | None = None, lang: str = "zh") -> list[Path]:
    """Write the edition of each notebook (default: every one with a translation file)."""
    written = []
    for notebook in notebooks or translated_notebooks(lang):
        nb = compose(Path(notebook).resolve(), lang)
        out = edition_path(notebook, lang)
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
        written.append(out)
    return written


def refresh_readme(readme: Path = ROOT / "README.md") -> bool:
    """Rewrite the README's generated chapter table (it links each chapter's built editions); True if changed."""
    text = readme.read_text(encoding="utf-8")
    new = re.sub(r"(<!-- chapters:start[^\n]*-->\n).*?(\n<!-- chapters:end -->)",
                 lambda m: m[1] + readme_table() + m[2], text, count=1, flags=re.S)
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


def todo(notebook: Path, lang: str = "zh") -> int:
    """Append an entry marked ``todo``, holding the English text, for each cell the translation lacks;
    re-mark stale entries ``todo`` with the new hash (their old translation kept, the new English beside
    it in a comment). Returns how many cells need a translator."""
    nb = nbformat.read(notebook, as_version=4)
    path = translation_path(notebook, lang)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER.format(lang=lang, notebook=notebook.name) + "\n"
    st = status(notebook, lang)
    by_id = {c.id: c for c in markdown_cells(nb)}
    for cell_id in st.stale:
        cell = by_id[cell_id]
        text = re.sub(rf"^<!-- cell {re.escape(cell_id)} · en [0-9a-f]{{12}}( · todo)? -->$",
                      f"<!-- cell {cell_id} · en {source_hash(cell.source)} · todo -->\n"
                      f"<!-- the English now reads:\n{cell.source.replace('-->', '--&gt;')}\n-->",
                      text, count=1, flags=re.M)
    entries = parse(path) if path.exists() else {}
    for cell_id in st.missing:
        if cell_id in entries:  # already a todo
            continue
        text = text.rstrip("\n") + f"\n\n<!-- cell {cell_id} · en {source_hash(by_id[cell_id].source)} · todo -->\n" \
            + by_id[cell_id].source + "\n"
    path.write_text(text, encoding="utf-8")
    return len(st.stale) + len(st.missing)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.edition", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("status", "todo", "build"))
    p.add_argument("notebooks", nargs="*", type=Path, metavar="NOTEBOOK")
    p.add_argument("--lang", default="zh", choices=LANGS)
    args = p.parse_args(argv)
    paths = [n.resolve() for n in args.notebooks]
    try:
        if args.command == "build":
            for out in build(paths or None, args.lang):
                print(f"built {_rel(out)}")
            if refresh_readme():
                print("README.md: the chapter table now links the edition's notebooks")
            return 0
        if args.command == "todo":
            if not paths:
                p.error("todo needs a NOTEBOOK")
            for path in paths:
                print(f"{_rel(translation_path(path, args.lang))}: {todo(path, args.lang)} cell(s) to translate")
            return 0
        rows = []
        for path in paths or sorted(NOTEBOOKS.glob("ch*.ipynb")):
            st = status(path, args.lang)
            rows.append(f"{st.notebook:<44} {len(st.translated):>3}/{st.markdown:<3} translated"
                        f"{f', {len(st.stale)} stale' if st.stale else ''}"
                        f"{f', {len(st.orphans)} orphaned' if st.orphans else ''}")
        print("\n".join(rows))
        return 0
    except EditionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
