"""Editions of the course in other languages, from one source: the English notebooks.

    python -m course.edition status [--lang zh]            # per chapter: translated, stale, missing cells
    python -m course.edition todo NOTEBOOK [--lang zh]     # add what a translation lacks, marked "todo"
    python -m course.edition build [NOTEBOOK ...] [--lang zh]   # write notebooks/zh/chNN_<slug>.ipynb
    python -m course.build --lang zh                        # the same build

The English notebook is the reference. Every markdown cell is translated; a code cell may be, in its
comments, docstrings and the string literals it shows a reader (prints, figure labels, widget
descriptions): its code stays the English reference's, which ``same_code`` checks (identifiers,
operators, numbers and every other string alike). Each translation lives in
``course/i18n/<lang>/chNN_<slug>.md``, under a marker naming the cell id and a hash of the English
source it translates; a code cell's marker ends in ``· code`` and its text is one fenced block::

    <!-- cell b6aeea02 · en 3f0c9a1b2d4e -->
    ### 同一个内核体搬到 GPU 上：`numba.cuda` 与 CUDA C++
    ...

An edition whose code cells are all English copies the English outputs. One with translated code cells
is executed, in a kernel that speaks its language (``course.i18n``: library messages from gettext
catalogs, figures in a CJK font), so its prints and figures are the reader's; ``compare_outputs`` then
holds every number it prints to the English output's.

When the English cell changes, its hash no longer matches: the translation is *stale*, and building
the edition (and ``tests/course/test_edition.py``) fails and names the cell, so an edition never silently
drifts from the reference. A marker ending in ``· todo`` holds text still to be translated (``todo``
writes the English there); it counts as missing.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course.syllabus import readme_table

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
I18N = ROOT / "course" / "i18n"
LANGS = ("zh",)
MARKER = re.compile(r"^<!-- cell (\S+) · en ([0-9a-f]{12})( · code)?( · todo)? -->$")
FENCE = re.compile(r"^```python\n(.*)\n```$", re.S)
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
    code: bool = False


@dataclass
class Status:
    notebook: str
    markdown: int = 0                                   # markdown cells in the English notebook
    translated: list = field(default_factory=list)
    stale: list = field(default_factory=list)           # the English changed since the translation
    missing: list = field(default_factory=list)         # no translation, or marked todo
    orphans: list = field(default_factory=list)         # translations of cells the notebook no longer has
    code: int = 0                                       # code cells in the English notebook
    code_translated: list = field(default_factory=list)
    wrong: list = field(default_factory=list)           # "id: why": a code translation that changes the code

    @property
    def complete(self) -> bool:
        return not (self.stale or self.missing or self.orphans or self.wrong)


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
            if current.code and not current.todo:
                fenced = FENCE.match(current.text)
                if not fenced:
                    raise EditionError(f"{path}: code cell {current.cell_id}: its text must be one ```python block")
                current.text = fenced[1]
            if current.cell_id in entries:
                raise EditionError(f"{path}: cell {current.cell_id} is translated twice")
            entries[current.cell_id] = current

    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = MARKER.match(line)
        if m:
            close()
            current, lines = Entry(m[1], m[2], "", todo=bool(m[4]), code=bool(m[3])), []
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
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        ids.add(cell.id)
        st.code += 1
        e = entries.get(cell.id)
        if e is None:  # a code cell may stay English
            continue
        if not e.code:
            st.wrong.append(f"{cell.id}: a code cell's marker ends in '· code'")
        elif e.todo:
            st.missing.append(cell.id)
        elif e.en_hash != source_hash(cell.source):
            st.stale.append(cell.id)
        elif why := same_code(cell.source, e.text):
            st.wrong.append(f"{cell.id}: {why}")
        else:
            st.code_translated.append(cell.id)
    for cell in markdown_cells(nb):
        ids.add(cell.id)
        e = entries.get(cell.id)
        if e is not None and e.code:
            st.wrong.append(f"{cell.id}: a markdown cell's marker has '· code'")
        elif e is None or e.todo or not e.text.strip():
            st.missing.append(cell.id)
        elif e.en_hash != source_hash(cell.source):
            st.stale.append(cell.id)
        else:
            st.translated.append(cell.id)
    st.orphans = sorted(set(entries) - ids)
    return st


# Comments the tooling reads: they stay as the English cell has them, in order.
DIRECTIVE = re.compile(r"#\s*NBVAL_\w+|### (BEGIN|END) SOLUTION")
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")


def _shape(tree: ast.AST) -> tuple[str, list[tuple[str, str]]]:
    """The code of ``tree`` with its text taken out: (a dump in which every string is blank and an f-string
    keeps only its fields, in sorted order; the strings taken out, in order)."""
    texts = []

    class Blank(ast.NodeTransformer):
        def visit_JoinedStr(self, node):
            literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            texts.append((literal, "f-string"))
            fields = []
            for v in node.values:
                if isinstance(v, ast.FormattedValue):  # its expression's strings are text too; its format spec is code
                    v.value = self.visit(v.value)
                    fields.append(ast.dump(v))
            return ast.Constant(value="\x00".join(sorted(fields)))

        def visit_Constant(self, node):
            if isinstance(node.value, str):
                texts.append((node.value, "string"))
                return ast.Constant(value="")
            return node

    return ast.dump(Blank().visit(tree)), texts


def same_code(en: str, translated: str) -> str:
    """Why ``translated`` is not the English cell's code with its text translated ("" when it is): it must
    parse to the same tree once strings are blanked (names, operators, numbers, f-string fields alike); a
    string may differ only by being translated (it then holds Chinese); the directive comments
    (NBVAL_*, ### BEGIN/END SOLUTION) stay."""
    if [m[0] for m in DIRECTIVE.finditer(en)] != [m[0] for m in DIRECTIVE.finditer(translated)]:
        return "the NBVAL_ / ### BEGIN/END SOLUTION comments differ from the English"
    try:
        en_tree, zh_tree = ast.parse(en), ast.parse(translated)
    except SyntaxError as e:  # a cell with IPython syntax: only its comments may change
        strip = lambda src: [ln.split("#")[0].rstrip() for ln in src.splitlines() if ln.split("#")[0].strip()]
        return "" if strip(en) == strip(translated) else f"not Python ({e.msg}) and more than comments differ"
    (en_dump, en_texts), (zh_dump, zh_texts) = _shape(en_tree), _shape(zh_tree)
    if en_dump != zh_dump or len(en_texts) != len(zh_texts):
        return "the code differs from the English (not only comments and strings)"
    for (a, kind), (b, _) in zip(en_texts, zh_texts):
        if a != b and not CJK.search(b):
            return f"the {kind} {a!r} became {b!r}: a string changes only into its translation"
    return ""


def compose(notebook: Path, lang: str = "zh"):
    """The edition of ``notebook``: the English one with each markdown cell's source translated."""
    st = status(notebook, lang)
    if not st.complete:
        parts = [f"{name}: {', '.join(ids)}" for name, ids in
                 (("stale (the English changed since)", st.stale), ("missing", st.missing),
                  ("no such cell", st.orphans), ("wrong", st.wrong)) if ids]
        raise EditionError(f"{_rel(translation_path(notebook, lang))}: " + "; ".join(parts)
                           + f" (python -m course.edition todo {_rel(notebook)} --lang {lang})")
    entries = parse(translation_path(notebook, lang))
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown" or (cell.cell_type == "code" and cell.id in entries):
            cell.source = entries[cell.id].text
    nb.metadata["language"] = lang
    nb.metadata["edition_of"] = f"../{notebook.name}"
    return nb


def translated_notebooks(lang: str = "zh") -> list[Path]:
    """The English notebooks that have a translation file in ``lang``."""
    folder = I18N / lang
    return [NOTEBOOKS / (p.stem + ".ipynb") for p in sorted(folder.glob("ch*.md"))] if folder.exists() else []


def speaks(notebook: Path, lang: str = "zh") -> bool:
    """Whether the edition translates code cells, so that it is executed in ``lang`` (not copied)."""
    path = translation_path(notebook, lang)
    return path.exists() and any(e.code for e in parse(path).values())


def execute(nb, lang: str, folder: Path = NOTEBOOKS, timeout: int = 300):
    """Run the edition, as course.build runs a chapter, in a kernel that speaks ``lang`` (course.i18n);
    a failing cell raises EditionError."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(folder)}})
    try:
        client.execute(env=os.environ | {"PYTHONHASHSEED": "0", "ZERO_LAB_LANG": lang})
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        raise EditionError(f"a cell failed in the {lang} kernel:\n{e}") from None
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nb


def _kept_outputs(nb, built: Path) -> bool:
    """Copy into ``nb`` the outputs of the edition built before, if its code cells are ``nb``'s; True if so."""
    if not built.exists():
        return False
    old = nbformat.read(built, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    before = [c for c in old.cells if c.cell_type == "code"]
    if [(c.id, c.source) for c in code] != [(c.id, c.source) for c in before]:
        return False
    for cell, prior in zip(code, before):
        cell.outputs, cell.execution_count = prior.outputs, prior.execution_count
    nb.metadata = old.metadata
    return True


def build(notebooks: list[Path] | None = None, lang: str = "zh", keep_outputs: bool = False) -> list[Path]:
    """Write the edition of each notebook (default: every one with a translation file); an edition with
    translated code cells is executed in ``lang`` and must print the English numbers (``compare_outputs``).
    ``keep_outputs``: an edition whose code cells did not change keeps its outputs (a fix to its prose)."""
    written = []
    for notebook in notebooks or translated_notebooks(lang):
        notebook = Path(notebook).resolve()
        nb = compose(notebook, lang)
        if speaks(notebook, lang) and not (keep_outputs and _kept_outputs(nb, edition_path(notebook, lang))):
            nb = execute(nb, lang, notebook.parent)
        if speaks(notebook, lang):
            bad = compare_outputs(nbformat.read(notebook, as_version=4), nb)
            if bad:
                raise EditionError(f"{_rel(edition_path(notebook, lang))}: " + "; ".join(bad))
        out = edition_path(notebook, lang)
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
        written.append(out)
    return written


NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")
IGNORED = re.compile(r"#\s*NBVAL_(IGNORE_OUTPUT|SKIP)")


def _sanitize(text: str) -> str:
    """``text`` as nbval compares it (course/nbval_sanitize.cfg): volatile paths, ports, pids, times masked."""
    lines = (ROOT / "course" / "nbval_sanitize.cfg").read_text(encoding="utf-8").splitlines()
    for a, b in zip(lines, lines[1:]):
        if a.startswith("regex: ") and b.startswith("replace: "):
            text = re.sub(a[len("regex: "):], b[len("replace: "):], text)
    return text


def output_text(cell) -> str:
    """What a code cell printed and displayed as text (streams, text/plain), in order."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "text/plain" in out.get("data", {}):
            parts.append(out.data["text/plain"])
    return "".join(parts)


def images(cell) -> list[str]:
    return [out.data["image/png"] for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]


# Two English words in a row make a line English; identifiers (all_reduce, fc1.weight) are not words.
WORDS = re.compile(r"(?<![\w.])[A-Za-z]{2,}[ \t]+[A-Za-z]{2,}(?![\w.(])")


def _english(line: str) -> bool | None:
    """True for a line of English, False for one in Chinese, None for a line without words (numbers, code)."""
    if CJK.search(line):
        return False
    return True if WORDS.search(line) else None


def reader_lines(nb) -> dict[str, list[str]]:
    """What a reader reads outside the prose, line by line: ``comments`` (comments and docstrings of code
    cells; NBVAL_ and solution markers left out) and ``printed`` (text the cells print or display, less the
    library code that ``course.show`` prints, which is code)."""
    import io
    import tokenize

    comments, printed = [], []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        try:
            for tok in tokenize.generate_tokens(io.StringIO(cell.source).readline):
                if tok.type == tokenize.COMMENT and not DIRECTIVE.search(tok.string):
                    comments.append(tok.string)
        except (tokenize.TokenError, SyntaxError):
            pass
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            tree = None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
                doc = ast.get_docstring(node, clean=True)
                comments += doc.splitlines() if doc else []
        if "show(" not in cell.source:
            printed += output_text(cell).splitlines()
    return {"comments": comments, "printed": printed}


def english_share(nb) -> dict[str, tuple[int, int]]:
    """Per kind of ``reader_lines``: (lines in English, lines with words)."""
    share = {}
    for kind, lines in reader_lines(nb).items():
        marks = [m for m in map(_english, lines) if m is not None]
        share[kind] = (sum(marks), len(marks))
    return share


def compare_outputs(en, ed) -> list[str]:
    """What keeps an executed edition from being the English notebook's outputs in another language: a cell
    whose printed numbers differ from the English cell's (as a multiset: a sentence may order them otherwise;
    after nbval's sanitizing), a cell
    with another count of figures, or a figure byte-identical to the English one (its labels untranslated). Cells whose output nbval
    ignores (NBVAL_IGNORE_OUTPUT) are left out, as nbval leaves them."""
    problems = []
    ed_cells = {c.get("id"): c for c in ed.cells if c.cell_type == "code"}
    for cell in (c for c in en.cells if c.cell_type == "code"):
        other = ed_cells.get(cell.get("id"))
        if other is None:
            problems.append(f"{cell.id}: no such code cell in the edition")
            continue
        if not IGNORED.search(cell.source):
            a, b = (Counter(NUMBER.findall(_sanitize(output_text(c)))) for c in (cell, other))
            if a != b:
                problems.append(f"{cell.id}: prints other numbers than the English (only in English: "
                                f"{sorted((a - b).elements())[:5]}, only here: {sorted((b - a).elements())[:5]})")
        en_img, ed_img = images(cell), images(other)
        if len(en_img) != len(ed_img):
            problems.append(f"{cell.id}: {len(ed_img)} figure(s), the English has {len(en_img)}")
        elif any(x == y for x, y in zip(en_img, ed_img)):
            problems.append(f"{cell.id}: a figure is byte-identical to the English one")
    return problems


def refresh_readme(readme: Path = ROOT / "README.md", lang: str = "en") -> bool:
    """Rewrite the README's generated chapter table (it links each chapter's built editions); True if changed."""
    text = readme.read_text(encoding="utf-8")
    new = re.sub(r"(<!-- chapters:start[^\n]*-->\n).*?(\n<!-- chapters:end -->)",
                 lambda m: m[1] + readme_table(lang) + m[2], text, count=1, flags=re.S)
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


def todo(notebook: Path, lang: str = "zh", code: bool = False) -> int:
    """Append an entry marked ``todo``, holding the English text, for each cell the translation lacks
    (``code``: each code cell too); re-mark stale entries ``todo`` with the new hash (their old translation
    kept, the new English beside it in a comment). Returns how many cells need a translator."""
    nb = nbformat.read(notebook, as_version=4)
    path = translation_path(notebook, lang)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER.format(lang=lang, notebook=notebook.name) + "\n"
    st = status(notebook, lang)
    by_id = {c.id: c for c in nb.cells if c.cell_type in ("markdown", "code")}
    for cell_id in st.stale:
        cell = by_id[cell_id]
        kind = " · code" if cell.cell_type == "code" else ""
        text = re.sub(rf"^<!-- cell {re.escape(cell_id)} · en [0-9a-f]{{12}}( · code)?( · todo)? -->$",
                      f"<!-- cell {cell_id} · en {source_hash(cell.source)}{kind} · todo -->\n"
                      f"<!-- the English now reads:\n{cell.source.replace('-->', '--&gt;')}\n-->",
                      text, count=1, flags=re.M)
    entries = parse(path) if path.exists() else {}
    for cell_id in st.missing:
        if cell_id in entries:  # already a todo
            continue
        text = text.rstrip("\n") + f"\n\n<!-- cell {cell_id} · en {source_hash(by_id[cell_id].source)} · todo -->\n" \
            + by_id[cell_id].source + "\n"
    added = 0
    for cell in (c for c in nb.cells if code and c.cell_type == "code" and c.id not in entries):
        text = text.rstrip("\n") + f"\n\n<!-- cell {cell.id} · en {source_hash(cell.source)} · code · todo -->\n" \
            f"```python\n{cell.source}\n```\n"
        added += 1
    path.write_text(text, encoding="utf-8")
    return len(st.stale) + len(st.missing) + added


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.edition", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("status", "todo", "build"))
    p.add_argument("notebooks", nargs="*", type=Path, metavar="NOTEBOOK")
    p.add_argument("--lang", default="zh", choices=LANGS)
    p.add_argument("--code", action="store_true", help="todo: add the code cells too (comments, strings)")
    p.add_argument("--keep-outputs", action="store_true",
                   help="build: an executed edition whose code did not change keeps its outputs (prose fixes)")
    args = p.parse_args(argv)
    paths = [n.resolve() for n in args.notebooks]
    try:
        if args.command == "build":
            for out in build(paths or None, args.lang, args.keep_outputs):
                print(f"built {_rel(out)}")
            if refresh_readme():
                print("README.md: the chapter table now links the edition's notebooks")
            if refresh_readme(ROOT / f"README.{args.lang}.md", args.lang):
                print(f"README.{args.lang}.md: its chapter table now links the edition's notebooks")
            return 0
        if args.command == "todo":
            if not paths:
                p.error("todo needs a NOTEBOOK")
            for path in paths:
                print(f"{_rel(translation_path(path, args.lang))}: {todo(path, args.lang, args.code)} cell(s) to translate")
            return 0
        rows = []
        for path in paths or sorted(NOTEBOOKS.glob("ch*.ipynb")):
            st = status(path, args.lang)
            rows.append(f"{st.notebook:<44} {len(st.translated):>3}/{st.markdown:<3} translated"
                        f"; code {len(st.code_translated):>3}/{st.code:<3}"
                        f"{f', {len(st.stale)} stale' if st.stale else ''}"
                        f"{f', {len(st.wrong)} wrong' if st.wrong else ''}"
                        f"{f', {len(st.orphans)} orphaned' if st.orphans else ''}")
        print("\n".join(rows))
        return 0
    except EditionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
