"""The syllabus is complete, well formed and renders the cells and table others use."""

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from course import syllabus
from course.syllabus import (
    ALLOWED_MODULES,
    CHAPTERS,
    Chapter,
    by_slug,
    chapter,
    readme_table,
    title_markdown,
)

from tests.helpers import ROOT


def test_thirty_chapters_numbered_in_order():
    assert len(CHAPTERS) == 30
    assert [ch.number for ch in CHAPTERS] == list(range(1, 31))
    assert all(isinstance(ch, Chapter) for ch in CHAPTERS)


def test_slugs_unique_short_snake_case():
    slugs = [ch.slug for ch in CHAPTERS]
    assert len(set(slugs)) == len(slugs)
    for slug in slugs:
        assert re.fullmatch(r"[a-z0-9_]+", slug), slug
        assert len(slug) <= 32, slug


@pytest.mark.parametrize("ch", CHAPTERS, ids=lambda ch: f"ch{ch.number:02d}")
def test_chapter_fields(ch):
    assert ch.title_en.strip() and ch.title_zh.strip()
    assert re.search(r"[\u4e00-\u9fff]", ch.title_zh), "Chinese title has no Chinese"
    assert 3 <= len(ch.goals) <= 5
    assert all(goal.strip() and goal[0].isupper() for goal in ch.goals)
    assert ch.seed.strip().startswith("Seed ch.")
    assert ch.modules
    assert set(ch.modules) <= ALLOWED_MODULES
    assert len(set(ch.modules)) == len(ch.modules)
    assert ch.notebook == f"ch{ch.number:02d}_{ch.slug}.ipynb"


@pytest.mark.parametrize("module", sorted(ALLOWED_MODULES))
def test_every_module_a_chapter_may_name_exists(module):
    name = "zero_ref.launcher" if module == "zero_ref.launch" else module
    assert importlib.util.find_spec(name) is not None, f"{module} is not a module of the project"


@pytest.mark.parametrize("ch", CHAPTERS, ids=lambda ch: f"ch{ch.number:02d}")
def test_each_chapter_notebook_uses_the_modules_the_syllabus_names(ch):
    """The syllabus says which code a chapter teaches; its notebook's code cells must use each module."""
    path = ROOT / "notebooks" / ch.notebook
    if not path.exists():
        pytest.skip(f"{ch.notebook} not written yet")
    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    # the experiments the cells call: every course.labs module the notebook imports (chNN.py, or one named after its idea)
    labs = set(re.findall(r"from course\.labs\.(\w+) import", code))
    for names in re.findall(r"from course\.labs import ([\w, ]+)", code):
        labs.update(n.strip() for n in names.split(","))
    for name in sorted(labs):
        harness = ROOT / "course" / "labs" / f"{name}.py"
        if harness.exists():
            code += "\n" + harness.read_text()
    for module in ch.modules:
        leaf = module.rsplit(".", 1)[-1]
        used = re.search(rf"\b{leaf}\b", code) if module != "zero_ref.launch" else re.search(r"\blaunch\(|torchrun", code)
        assert used, f"{ch.notebook} never uses {module}, which the syllabus lists for chapter {ch.number}"


def test_chapter_is_frozen():
    with pytest.raises(AttributeError):
        chapter(1).slug = "other"  # type: ignore[misc]


def test_chapter_lookup():
    for ch in CHAPTERS:
        assert chapter(ch.number) is ch
        assert by_slug(ch.slug) is ch


@pytest.mark.parametrize("bad", [0, 31, -1, 1.0, "1", True])
def test_chapter_out_of_range_names_the_range(bad):
    with pytest.raises(ValueError) as err:
        chapter(bad)
    assert "1" in str(err.value) and "30" in str(err.value)


def test_by_slug_unknown_is_a_clear_error():
    with pytest.raises(ValueError, match="zero_ofload"):
        by_slug("zero_ofload")


def test_chapter_validates_its_fields():
    good = dict(
        number=1,
        slug="x",
        title_en="T",
        title_zh="标题",
        goals=("Do a", "Do b", "Do c"),
        seed="Seed ch.1",
        modules=("sim",),
    )
    Chapter(**good)
    for change in (
        {"number": 31},
        {"slug": "Bad-Slug"},
        {"goals": ("Do a", "Do b")},
        {"modules": ("zero_ref.nowhere",)},
        {"title_en": "a | b"},
    ):
        with pytest.raises(ValueError):
            Chapter(**{**good, **change})


def test_title_markdown_layout():
    ch = chapter(1)
    text = title_markdown(ch)
    assert text.startswith("# Chapter 1 · ")
    assert not text.endswith("\n")
    lines = text.split("\n")
    assert lines[0] == f"# Chapter 1 · {ch.title_en}"
    assert lines[1] == f"## {ch.title_zh}"
    assert lines[2] == ""
    assert lines[3] == f"*Mirrors: {ch.seed}*"
    assert lines[4] == ""
    assert lines[5] == "**Learning goals**"
    assert lines[6:] == [f"- {goal}" for goal in ch.goals]


def test_readme_table_shape():
    lines = readme_table().split("\n")
    assert len(lines) == 32
    assert lines[0] == "| # | Chapter | 章节 | Notebook |"
    assert re.fullmatch(r"\|(-+\|){4}", lines[1])
    for ch, row in zip(CHAPTERS, lines[2:]):
        cells = [c.strip() for c in row.strip("|").split("|")]
        stem = f"ch{ch.number:02d}_{ch.slug}"
        zh = ROOT / "notebooks" / "zh" / f"{stem}.ipynb"
        assert cells == [
            str(ch.number),
            ch.title_en,
            f"[{ch.title_zh}](notebooks/zh/{stem}.ipynb)" if zh.exists() else ch.title_zh,
            f"[{stem}](notebooks/{stem}.ipynb)",
        ]


def test_main_prints_the_table(capsys):
    syllabus.main()
    assert capsys.readouterr().out == readme_table() + "\n"


def test_no_heavy_imports():
    assert "torch" not in vars(syllabus) and "numpy" not in vars(syllabus)
    source = open(syllabus.__file__, encoding="utf-8").read()
    assert not re.search(r"^\s*(import|from)\s+(torch|numpy)\b", source, re.M)
