"""The Chinese edition keeps to one vocabulary: course/glossary.md's banned renderings, per term, over every chapter."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from course import edition

GLOSSARY = Path(edition.ROOT) / "course" / "glossary.md"


def banned() -> list[tuple[str, re.Pattern]]:
    """(term, pattern) for every banned rendering in the glossary's table."""
    text = GLOSSARY.read_text(encoding="utf-8")
    table = text.split("## 禁用译法", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| term")]
    out = []
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        term, patterns = cells[0], cells[-1]
        for spec in patterns.split(" · "):
            out.append((term, re.compile(spec.strip().strip("`").replace("\\|", "|"))))
    return out


def violations(path: Path) -> list[str]:
    """``term: 'match' (line N)`` for each banned rendering in one translation file."""
    found, rules = [], banned()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for term, pattern in rules:
            found += [f"{term}: {m[0]!r} (line {n})" for m in pattern.finditer(line)]
    return found


CHAPTERS = sorted((edition.I18N / "zh").glob("ch*.md"))


def test_the_banned_renderings_catch_the_review_examples():
    """Each rule flags a sentence the review found (so a rule that no longer matches is noticed)."""
    flagged = {term for term, pattern in banned() for sentence in (
        "单块 GPU 的工作内存也放不下", "评分单元在两个真实 rank 上", "预热阶段 / 稳态阶段 / 冷却阶段", "梯度以训练精度下传",
        "同一个旋钮被赋了两个值", "在配置节中", "在用参数的上限", "清零的 Adam 矩", "线路字节数", "负责这份记账",
        "做 reduce-scatter", "毫无怨言地保存") if pattern.search(sentence)}
    assert flagged == {term for term, _ in banned()}
    assert not any(p.search("评分单元格对课程 GPT 在 ZeRO-3 下的每个单元调用你的函数；做 All-Gather") for _, p in banned())


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_the_edition_keeps_to_the_glossary(path):
    assert violations(path) == []
