"""Language editions (course/edition.py): built from the English notebooks, never drifting from them."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from course import edition


def _notebook(folder: Path, prose: str = "## Concept\n\nAdam reads 16 bytes per parameter.") -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Chapter 99 · A test", id="title"),
                nbformat.v4.new_markdown_cell(prose, id="concept"),
                nbformat.v4.new_code_cell("print(16 * 2)", id="code-1")]
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="32\n")]
    path = folder / "ch99_test.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setattr(edition, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(edition, "I18N", tmp_path / "i18n")
    return tmp_path


def _translate(path: Path, texts: dict[str, str]) -> None:
    """Do what a translator does to the file `todo` wrote: replace the English, drop the todo mark."""
    src = path.read_text(encoding="utf-8")
    for cell_id, text in texts.items():
        head, rest = src.split(f"<!-- cell {cell_id} · en ", 1)
        digest, rest = rest.split(" · todo -->\n", 1)
        nxt = rest.find("\n<!-- cell ")
        src = head + f"<!-- cell {cell_id} · en {digest} -->\n{text}\n" + (rest[nxt:] if nxt >= 0 else "")
    path.write_text(src, encoding="utf-8")


def test_todo_then_translate_then_build_keeps_code_and_outputs(repo):
    en = _notebook(repo / "notebooks")
    assert edition.todo(en) == 2
    with pytest.raises(edition.EditionError, match="missing: title, concept"):
        edition.compose(en)
    _translate(edition.translation_path(en), {"title": "# 第 99 章 · 测试",
                                              "concept": "## 概念\n\nAdam 每个参数读取 16 字节。"})
    out, = edition.build([en])
    zh, ref = nbformat.read(out, as_version=4), nbformat.read(en, as_version=4)
    assert [c.source for c in zh.cells[:2]] == ["# 第 99 章 · 测试", "## 概念\n\nAdam 每个参数读取 16 字节。"]
    assert zh.cells[2].source == ref.cells[2].source and zh.cells[2].outputs == ref.cells[2].outputs
    assert zh.metadata["language"] == "zh" and out == repo / "notebooks" / "zh" / "ch99_test.ipynb"


def test_a_changed_english_cell_makes_its_translation_stale(repo):
    en = _notebook(repo / "notebooks")
    edition.todo(en)
    _translate(edition.translation_path(en), {"title": "# 第 99 章", "concept": "## 概念\n\n16 字节。"})
    assert edition.status(en).complete
    _notebook(repo / "notebooks", prose="## Concept\n\nAdam reads 28 bytes per parameter.")  # the English moves
    st = edition.status(en)
    assert st.stale == ["concept"] and st.translated == ["title"]
    with pytest.raises(edition.EditionError, match=r"stale \(the English changed since\): concept"):
        edition.build([en])
    # todo re-marks it, keeping the old translation and showing the new English beside it
    assert edition.todo(en) == 1
    text = edition.translation_path(en).read_text(encoding="utf-8")
    assert "16 字节。" in text and "Adam reads 28 bytes per parameter." in text
    assert edition.status(en).missing == ["concept"]


def test_translations_of_cells_the_notebook_lost_are_named(repo):
    en = _notebook(repo / "notebooks")
    edition.todo(en)
    path = edition.translation_path(en)
    _translate(path, {"title": "# 第 99 章", "concept": "## 概念"})
    path.write_text(path.read_text(encoding="utf-8") + "\n<!-- cell gone · en 000000000000 -->\n旧的\n",
                    encoding="utf-8")
    with pytest.raises(edition.EditionError, match="no such cell: gone"):
        edition.compose(en)


def test_a_cell_translated_twice_is_an_error(repo):
    en = _notebook(repo / "notebooks")
    path = edition.translation_path(en)
    path.parent.mkdir(parents=True)
    h = edition.source_hash("# Chapter 99 · A test")
    path.write_text(f"<!-- cell title · en {h} -->\n一\n\n<!-- cell title · en {h} -->\n二\n", encoding="utf-8")
    with pytest.raises(edition.EditionError, match="cell title is translated twice"):
        edition.parse(path)


# -- the repository's editions ----------------------------------------------------------------------

TRANSLATED = [(lang, nb) for lang in edition.LANGS for nb in edition.translated_notebooks(lang)]


@pytest.mark.parametrize("lang,notebook", TRANSLATED, ids=[f"{lang}-{nb.stem}" for lang, nb in TRANSLATED])
def test_every_translation_is_complete_fresh_and_built(lang, notebook):
    st = edition.status(notebook, lang)
    assert st.complete, (f"{edition.translation_path(notebook, lang)}: stale {st.stale}, missing {st.missing}, "
                         f"orphaned {st.orphans}: python -m course.edition todo notebooks/{notebook.name} --lang {lang}")
    built = edition.edition_path(notebook, lang)
    assert built.exists(), f"{built} not built: python -m course.build --lang {lang}"
    on_disk = json.loads(built.read_text(encoding="utf-8"))
    fresh = json.loads(nbformat.writes(edition.compose(notebook, lang)))
    assert on_disk == fresh, f"{built} is older than its sources: python -m course.build --lang {lang}"
    def code(nb):
        return [(c.source, c.get("outputs")) for c in nb.cells if c.cell_type == "code"]
    assert code(nbformat.read(built, as_version=4)) == code(nbformat.read(notebook, as_version=4))


def test_no_edition_notebook_without_its_translation():
    for lang in edition.LANGS:
        folder = edition.NOTEBOOKS / lang
        built = {p.name for p in folder.glob("ch*.ipynb")} if folder.exists() else set()
        sources = {nb.name for nb in edition.translated_notebooks(lang)}
        assert built <= sources, f"notebooks/{lang}/ holds {sorted(built - sources)} with no translation file"


@pytest.mark.parametrize("lang,notebook", TRANSLATED, ids=[f"{lang}-{nb.stem}" for lang, nb in TRANSLATED])
def test_an_edition_releases_and_grades_as_the_english_one(lang, notebook, tmp_path):
    """`make release` strips the same solutions from both editions, so a student of either edition hands in
    the same code cells and `course.assign grade` (the English reference's checks) treats them alike."""
    from course.assign import release

    en, = release([notebook], tmp_path / "en")
    ed, = release([edition.edition_path(notebook, lang)], tmp_path / lang)

    def code(path):
        return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    assert code(ed) == code(en) and code(en) != code(notebook)  # the solutions are gone from both
    assert nbformat.read(ed, as_version=4).cells[0].source != nbformat.read(en, as_version=4).cells[0].source
