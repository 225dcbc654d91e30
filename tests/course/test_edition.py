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
    en = nbformat.read(notebook, as_version=4)
    if edition.speaks(notebook, lang):  # executed in its language: sources as composed, numbers as the English
        assert _sources(on_disk) == _sources(fresh), f"{built} is older than its sources: python -m course.build --lang {lang}"
        assert edition.compare_outputs(en, nbformat.read(built, as_version=4)) == []
    else:  # copied: code and outputs are the English notebook's
        assert on_disk == fresh, f"{built} is older than its sources: python -m course.build --lang {lang}"
        def code(nb):
            return [(c.source, c.get("outputs")) for c in nb.cells if c.cell_type == "code"]
        assert code(nbformat.read(built, as_version=4)) == code(en)


def _sources(nb: dict) -> list:
    return [(c["cell_type"], c.get("id"), c["source"]) for c in nb["cells"]]


def test_no_edition_notebook_without_its_translation():
    for lang in edition.LANGS:
        folder = edition.NOTEBOOKS / lang
        built = {p.name for p in folder.glob("ch*.ipynb")} if folder.exists() else set()
        sources = {nb.name for nb in edition.translated_notebooks(lang)}
        assert built <= sources, f"notebooks/{lang}/ holds {sorted(built - sources)} with no translation file"


@pytest.mark.parametrize("lang,notebook", TRANSLATED, ids=[f"{lang}-{nb.stem}" for lang, nb in TRANSLATED])
def test_an_edition_releases_and_grades_as_the_english_one(lang, notebook, tmp_path):
    """`make release` strips the same solutions from both editions, so a student of either edition hands in
    the same code (the edition's comments and strings translated, its stubs raising in its language), and
    `course.assign grade` grades it against the edition's reference (notebooks/<lang>/)."""
    from course.assign import default_reference, release

    en, = release([notebook], tmp_path / "en")
    ed, = release([edition.edition_path(notebook, lang)], tmp_path / lang)

    def code(path):
        return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    assert code(en) != code(notebook)  # the solutions are gone
    stubs = [(a, b) for a, b in zip(code(en), code(ed)) if 'raise NotImplementedError("Task' in a]
    assert stubs and all('raise NotImplementedError("任务 ' in b for _, b in stubs)
    for a, b in zip(code(en), code(ed)):
        assert edition.same_code(a, b) == "" if "NotImplementedError" not in a else True
    assert nbformat.read(ed, as_version=4).cells[0].source != nbformat.read(en, as_version=4).cells[0].source
    assert default_reference(ed) == edition.edition_path(notebook, lang)
    assert default_reference(en) == notebook


# -- code cells: translated text, the English code ---------------------------------------------------

EN_CODE = '''def total(psi, n):
    """Bytes per GPU."""
    # sixteen bytes a parameter
    print(f"{psi:,} params over {n} GPUs: {16 * psi / n:.1f} bytes each", "(ok)")
    return {"params": 16 * psi / n}
'''
ZH_CODE = '''def total(psi, n):
    """每块 GPU 的字节数。"""
    # 每个参数 16 字节
    print(f"{n} 块 GPU 分 {psi:,} 个参数：每块 {16 * psi / n:.1f} 字节", "（正确）")
    return {"params": 16 * psi / n}
'''


def test_a_code_cell_may_change_its_comments_docstrings_and_printed_text():
    assert edition.same_code(EN_CODE, ZH_CODE) == ""  # f-string fields may move within the sentence


@pytest.mark.parametrize("change,why", [
    (("16 * psi / n:.1f", "15 * psi / n:.1f"), "code differs"),                  # a number
    (("16 * psi / n}", "16 * psi // n}"), "code differs"),                       # an operator
    (("def total(psi, n)", "def total(psi, m)"), "code differs"),                # a name
    (("{16 * psi / n:.1f}", "{16 * psi / n:.2f}"), "code differs"),              # a format spec
    (('{"params"', '{"参数"'), "code differs"),                                  # no: a key is code, see below
    (('"（正确）"', '"(fine)"'), "became '(fine)'"),                             # English into other English
], ids=["number", "operator", "name", "format-spec", "key", "english-string"])
def test_a_code_translation_that_changes_the_code_is_refused(change, why):
    old, new = change
    zh = ZH_CODE.replace(old, new)
    assert zh != ZH_CODE
    if old.startswith('{"params"'):  # a dict key translated is a string changed into Chinese: allowed by
        assert edition.same_code(EN_CODE, zh) == ""  # same_code; compare_outputs and the kernel catch its effect
        return
    assert why in edition.same_code(EN_CODE, zh)


def test_directive_comments_stay():
    en = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
    assert edition.same_code(en, en.replace("    ### END SOLUTION\n", "")).startswith("the NBVAL_")
    assert edition.same_code("# NBVAL_IGNORE_OUTPUT\nx = 1", "# 忽略输出\nx = 1").startswith("the NBVAL_")


def _outputs(text: str, png: str | None = None):
    cell = nbformat.v4.new_code_cell("print(x)", id="c")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    if png:
        cell.outputs.append(nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"}))
    return nbformat.v4.new_notebook(cells=[cell])


def test_compare_outputs_holds_numbers_and_figures_to_the_english():
    en = _outputs("stage 3 needs 130.0 GB per GPU > 80 GB\n", "iVBOR-en")
    assert edition.compare_outputs(en, _outputs("即使阶段 3 每块 GPU 也要 130.0 GB > 80 GB\n", "iVBOR-zh")) == []
    assert "only in English: ['130.0'], only here: ['131.0']" in \
        edition.compare_outputs(en, _outputs("阶段 3 每块 GPU 要 131.0 GB > 80 GB\n", "iVBOR-zh"))[0]
    assert "byte-identical" in edition.compare_outputs(en, _outputs("阶段 3：130.0 GB > 80 GB\n", "iVBOR-en"))[0]
    assert "0 figure(s)" in edition.compare_outputs(en, _outputs("阶段 3：130.0 GB > 80 GB\n"))[0]


def test_a_translated_code_cell_is_built_by_running_it_in_chinese(repo):
    en = _notebook(repo / "notebooks")
    nb = nbformat.read(en, as_version=4)
    nb.cells[2].source, nb.cells[2].outputs[0].text = 'print("total", 16 * 2)', "total 32\n"
    nbformat.write(nb, en)
    assert edition.todo(en, code=True) == 3
    path = edition.translation_path(en)
    _translate(path, {"title": "# 第 99 章 · 测试", "concept": "## 概念\n\nAdam 每个参数读取 16 字节。"})
    text = path.read_text(encoding="utf-8").replace(" · code · todo -->", " · code -->")
    path.write_text(text.replace('print("total", 16 * 2)', 'print("合计", 16 * 2, lang())'), encoding="utf-8")
    assert edition.status(en).wrong == ["code-1: the code differs from the English (not only comments and strings)"]
    path.write_text(text.replace('print("total", 16 * 2)', 'print("合计", 16 * 2)  # 两个 16'), encoding="utf-8")
    assert edition.status(en).code_translated == ["code-1"] and edition.speaks(en)
    out, = edition.build([en])
    cell = nbformat.read(out, as_version=4).cells[2]
    assert cell.source == 'print("合计", 16 * 2)  # 两个 16' and edition.output_text(cell) == "合计 32\n"
    # the English output moves (a re-run that prints another number): the edition no longer agrees with it
    nb.cells[2].outputs[0].text = "total 33\n"
    assert "only in English: ['33'], only here: ['32']" in edition.compare_outputs(nb, nbformat.read(out, as_version=4))[0]


def test_the_chinese_readme_lists_every_chapter():
    from course.syllabus import readme_table
    text = (edition.ROOT / "README.zh.md").read_text(encoding="utf-8")
    block = text.split("<!-- chapters:start", 1)[1].split("-->\n", 1)[1].split("\n<!-- chapters:end -->")[0]
    assert block == readme_table("zh"), "python -m course.edition build rewrites it"
    assert "make lab-zh" in text and "make grade STUDENTS=work/zh/" in text


# -- the kernel's language ----------------------------------------------------------------------------

def test_a_kernel_speaks_chinese_for_a_notebook_in_a_zh_folder(monkeypatch, tmp_path):
    from course import i18n
    monkeypatch.delenv("ZERO_LAB_LANG", raising=False)
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "work" / "zh" / "ch01_course_map.ipynb"))
    assert i18n.lang() == "zh" and i18n._("Task {task}").format(task="3.1") == "任务 3.1：把这一行换成你的代码"
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "work" / "ch01_course_map.ipynb"))
    assert i18n.lang() == "en" and i18n._("Task {task}") == "Task {task}"
    monkeypatch.setenv("ZERO_LAB_LANG", "zh")
    assert i18n.lang() == "zh"
    monkeypatch.setenv("ZERO_LAB_LANG", "fr")
    with pytest.raises(ValueError, match="ZERO_LAB_LANG='fr'"):
        i18n.lang()


def test_every_catalog_message_keeps_its_fields():
    """A translation that drops or renames a str.format field would raise or print less at run time."""
    import string

    from babel.messages.pofile import read_po

    from course import i18n
    with i18n.catalog_path("zh").open("rb") as f:
        catalog = read_po(f)
    messages = [m for m in catalog if m.id]
    assert len(messages) >= 20 and all(m.string for m in messages)
    for m in messages:
        def fields(text):
            return sorted(f for _, f, _, _ in string.Formatter().parse(text) if f is not None)
        assert fields(m.string) == fields(m.id), m.id


def test_chinese_figures_draw_hanzi_not_empty_boxes():
    import warnings

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course import i18n
    before = dict(matplotlib.rcParams)
    try:
        assert i18n.use_cjk_font() == "Noto Sans CJK SC"
        fig, ax = plt.subplots()
        ax.set_title("每块 GPU 的模型状态（GB）")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)" for a tofu box
            fig.canvas.draw()
        plt.close(fig)
    finally:
        matplotlib.rcParams.update({k: v for k, v in before.items() if k in ("font.family",)})


SPEAKING = [(lang, nb) for lang, nb in TRANSLATED if edition.speaks(nb, lang)]


@pytest.mark.parametrize("lang,notebook", SPEAKING, ids=[f"{lang}-{nb.stem}" for lang, nb in SPEAKING])
def test_what_a_reader_of_an_executed_edition_reads_is_in_its_language(lang, notebook):
    """Issue 38's bar: comment and docstring lines ≤ 5 % English, printed lines with words ≤ 10 % English
    (the English notebook: all of them), every figure redrawn (compare_outputs, above)."""
    ed = edition.english_share(nbformat.read(edition.edition_path(notebook, lang), as_version=4))
    en = edition.english_share(nbformat.read(notebook, as_version=4))
    (c_en, c_all), (p_en, p_all) = ed["comments"], ed["printed"]
    assert c_en <= 0.05 * c_all and p_en <= 0.10 * p_all, ed
    assert en["comments"][0] == en["comments"][1] > 0  # the measure sees English where there is English


def test_the_library_below_course_prints_in_the_bound_language(tmp_path):
    """zero_ref imports nothing of course: a Chinese kernel binds the gettext domain it translates with."""
    import subprocess
    import sys

    code = "import course; from zero_ref.memory import recipe_table; print(recipe_table().splitlines()[0])"
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("ZERO_LAB_LANG", "JPY_SESSION_NAME")}
    zh = subprocess.run([sys.executable, "-c", code], env=env | {"ZERO_LAB_LANG": "zh"}, cwd=tmp_path,
                        capture_output=True, text=True, check=True).stdout
    en = subprocess.run([sys.executable, "-c", code], env=env | {"LANGUAGE": "zh", "LANG": "zh_CN.UTF-8"},
                        cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert zh.split() == ["精度方案", "缓冲区", "dtype", "字节/参数", "从该阶段起切分"]
    assert en.split() == ["recipe", "buffer", "dtype", "B/param", "partitioned", "from"]  # a Chinese locale alone: English
