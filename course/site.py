"""The course as a static web site: ``python -m course.site [-o site/]``.

Every chapter notebook (already executed: ``notebooks/`` holds the reference outputs) becomes one
HTML page with its rendered outputs and figures, a sidebar listing the thirty chapters, and
previous / next links; ``index.html`` holds the syllabus (titles, goals, seed sections),
``corrections.html`` the seed corrections the chapters make (course/seed_corrections.md) and
``glossary.html`` the English ↔ 中文 glossary (course/glossary.md), to which each chapter page links the
first use of every term in its prose (English terms on English pages, Chinese on Chinese). The Chinese edition
(``notebooks/zh/``, course/edition.py) goes under ``zh/`` with the same frame; every page links
to the same page in the other language (a chapter not yet translated links to the English one).
Pages are self-contained (figures are embedded), so the folder can be opened from disk or served
by any static host. nbconvert does the rendering: it is already in the course environment and
needs no network, unlike site generators that fetch their themes at build time.
"""
from __future__ import annotations

import argparse
import html
import re
import shutil
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

from course.syllabus import CHAPTERS

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
CORRECTIONS = REPO / "course" / "seed_corrections.md"
GLOSSARY = REPO / "course" / "glossary.md"

STYLE = """
body.zl { margin: 0; }
.zl-side { position: fixed; top: 0; left: 0; bottom: 0; width: 17rem; overflow-y: auto; padding: 1rem;
           background: #f6f6f8; border-right: 1px solid #ddd; font: 13px/1.4 sans-serif; }
.zl-side a { display: block; padding: 2px 0; color: #234; text-decoration: none; }
.zl-side a.here { font-weight: bold; }
.zl-side span.missing { display: block; padding: 2px 0; color: #999; }
.zl-main { margin-left: 19rem; padding: 1rem 2rem; max-width: 70rem; }
.zl-nav { display: flex; justify-content: space-between; font: 14px sans-serif; margin: 0.5rem 0 1rem; }
.zl-lang { float: right; font: 14px sans-serif; }
table.zl-syllabus td, table.zl-syllabus th { padding: 4px 8px; vertical-align: top; border-bottom: 1px solid #eee; }
"""


def page_name(ch) -> str:
    return ch.notebook.replace(".ipynb", ".html")


def sidebar(current: int | None, present: set[int], zh: bool = False, translated: set[int] = frozenset()) -> str:
    """The chapter list. In the Chinese edition (``zh``), chapters not yet translated link to the English page."""
    if zh:
        rows = ['<a href="index.html"><b>ZeRO Lab</b> — 课程大纲</a>', '<a href="../corrections.html">种子课程勘误</a>',
                '<a href="../glossary.html">术语表 Glossary</a><hr>']
    else:
        rows = ['<a href="index.html"><b>ZeRO Lab</b> — syllabus</a>', '<a href="corrections.html">Seed corrections</a>',
                '<a href="glossary.html">Glossary 术语表</a><hr>']
    for ch in CHAPTERS:
        title = ch.title_zh if zh else ch.title_en
        label = f"{ch.number}. {html.escape(title.split(':')[0].split('：')[0])}"
        cls = ' class="here"' if ch.number == current else ""
        if zh and ch.number in translated:
            rows.append(f'<a{cls} href="{page_name(ch)}">{label}</a>')
        elif ch.number in present:
            href = f"../{page_name(ch)}" if zh else page_name(ch)
            rows.append(f'<a{cls} href="{href}">{label}{" (English)" if zh else ""}</a>')
        else:
            rows.append(f'<span class="missing">{label}</span>')
    return '<nav class="zl-side">' + "\n".join(rows) + "</nav>"


def language_switch(href: str, zh: bool) -> str:
    """The link to this page in the other language."""
    return f'<div class="zl-lang"><a href="{href}">{"English" if zh else "中文"}</a></div>'


def prev_next(number: int, present: list[int], zh: bool = False) -> str:
    i = present.index(number)
    by_number = {ch.number: ch for ch in CHAPTERS}
    word, home = ("第 {} 章", "课程大纲") if zh else ("chapter {}", "syllabus")
    prev = (f'<a href="{page_name(by_number[present[i - 1]])}">← {word.format(present[i - 1])}</a>' if i > 0
            else "<span></span>")
    nxt = (f'<a href="{page_name(by_number[present[i + 1]])}">{word.format(present[i + 1])} →</a>'
           if i + 1 < len(present) else "<span></span>")
    return f'<div class="zl-nav">{prev}<a href="index.html">{home}</a>{nxt}</div>'


def wrap(body: str, head: str, side: str, nav: str = "") -> str:
    """Put a rendered body inside the site's frame (sidebar, navigation, extra style)."""
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'>{head}<style>{STYLE}</style></head>"
            f"<body class='zl'>{side}<main class='zl-main'>{nav}{body}{nav}</main></body></html>")


def render_notebook(path: Path) -> tuple[str, str]:
    """(head, body) of nbconvert's lab-template HTML for one executed notebook."""
    exporter = HTMLExporter(template_name="lab")
    full, _ = exporter.from_notebook_node(nbformat.read(path, as_version=4))
    head = re.search(r"<head>(.*?)</head>", full, re.S).group(1)
    body = re.search(r"<body[^>]*>(.*)</body>", full, re.S).group(1)
    return head, body


def index_page(present: set[int], zh: bool = False, translated: set[int] = frozenset()) -> str:
    rows = []
    for ch in CHAPTERS:
        first, second = (ch.title_zh, ch.title_en) if zh else (ch.title_en, ch.title_zh)
        title = html.escape(first)
        if zh and ch.number in translated:
            title = f'<a href="{page_name(ch)}">{title}</a>'
        elif ch.number in present:
            title = f'<a href="{"../" if zh else ""}{page_name(ch)}">{title}</a>'
        goals = "".join(f"<li>{html.escape(g)}</li>" for g in ch.goals)
        rows.append(f"<tr><td>{ch.number}</td><td>{title}<br><small>{html.escape(second)}</small>"
                    f"<ul>{goals}</ul></td><td><small>{html.escape(ch.seed)}</small></td></tr>")
    if zh:
        intro = ("<h1>ZeRO Lab</h1><p>从第一性原理学习 DeepSpeed 式分布式训练：三十章，每章一个 JupyterLab notebook，"
                 "建立在 <code>zero_ref</code>（真实的 <code>torch.distributed</code>）与 <code>sim</code>"
                 "（步时与显存的模拟器）之上。已译成中文的章节链接到中文版，其余链接到英文版。</p>"
                 "<table class='zl-syllabus'><tr><th>#</th><th>章节与学习目标</th><th>种子课程章节</th></tr>")
    else:
        intro = ("<h1>ZeRO Lab</h1><p>DeepSpeed-style distributed training from first principles: thirty chapters, "
                 "each a JupyterLab notebook built on <code>zero_ref</code> (real <code>torch.distributed</code>) and "
                 "<code>sim</code> (a simulator of step time and memory).</p>"
                 "<table class='zl-syllabus'><tr><th>#</th><th>Chapter and goals</th><th>Seed section</th></tr>")
    body = (language_switch("../index.html" if zh else "zh/index.html", zh) + intro + "\n".join(rows) + "</table>")
    return wrap(body, "<title>ZeRO Lab</title>", sidebar(None, present, zh, translated))


def glossary_terms(path: Path = GLOSSARY) -> list[tuple[str, str, str]]:
    """(English, 中文, anchor) of each term the glossary defines (its three-column tables)."""
    terms = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 3 or cells[0] in ("English", "") or not cells[0].strip("-: "):
            continue
        terms.append((cells[0], cells[1], "term-" + re.sub(r"[^a-z0-9]+", "-", cells[0].lower()).strip("-")))
    return terms


def _forms(term: str) -> list[str]:
    """The words a term appears as in prose: the parts of "a / b", without a parenthesised gloss."""
    bare = re.sub(r"\s*[（(][^）)]*[）)]", "", term)
    return [f.strip() for f in bare.split(" / ") if len(f.strip()) >= 2]


_SKIP = {"a", "code", "pre", "script", "style", "h1", "h2", "h3", "h4", "h5", "h6"}
_PROSE = {"p", "li"}


def link_first_uses(body: str, zh: bool, href: str = "glossary.html") -> str:
    """``body`` with the first use of each glossary term in its prose (paragraphs and list items; not code,
    links, headings, outputs or $math$) linked to the term's row of the glossary page."""
    forms = sorted(((f, anchor) for en, cn, anchor in glossary_terms() for f in _forms(cn if zh else en)),
                   key=lambda fa: -len(fa[0]))
    used, prose, skip, out = set(), 0, 0, []
    for token in re.split(r"(<[^>]+>)", body):
        if token.startswith("<"):
            m = re.match(r"</?\s*([a-zA-Z0-9]+)", token)
            name, closing = (m[1].lower(), token.startswith("</")) if m else ("", False)
            step = 0 if token.endswith("/>") else (-1 if closing else 1)
            prose += step * (name in _PROSE)
            skip += step * (name in _SKIP)
            out.append(token)
            continue
        if not prose or skip or not token.strip():
            out.append(token)
            continue
        parts = re.split(r"(\$[^$]*\$)", token)  # MathJax's inline math stays as it is
        for i, part in enumerate(parts):
            if i % 2:
                continue
            hits = []
            for form, anchor in forms:
                if anchor in used:
                    continue
                pattern = re.escape(form) if zh else rf"(?<![\w-]){re.escape(form)}(?![\w-])"
                m = re.search(pattern, part, flags=0 if zh else re.IGNORECASE)
                if m and not any(m.start() < e and s < m.end() for s, e, _ in hits):
                    hits.append((m.start(), m.end(), anchor))
                    used.add(anchor)
            for start, end, anchor in sorted(hits, reverse=True):
                part = f'{part[:start]}<a class="zl-term" href="{href}#{anchor}">{part[start:end]}</a>{part[end:]}'
            parts[i] = part
        out.append("".join(parts))
    return "".join(out)


def glossary_page() -> str:
    """The glossary rendered, each term's row with the anchor chapter pages link to."""
    page = markdown_page(GLOSSARY)
    for en, _, anchor in glossary_terms():
        page = page.replace(f"<tr>\n  <td>{html.escape(en, quote=False)}</td>",
                            f'<tr id="{anchor}">\n  <td>{html.escape(en, quote=False)}</td>', 1)
    return page


def markdown_page(path: Path) -> str:
    """A Markdown file rendered with nbconvert's own Markdown renderer (mistune)."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune
    return markdown2html_mistune(path.read_text(encoding="utf-8"))


def build(out: Path = REPO / "site", notebooks: Path = NOTEBOOKS) -> list[Path]:
    """Write the site into ``out`` (replacing it) and return the pages written."""
    files = {ch.number: notebooks / ch.notebook for ch in CHAPTERS if (notebooks / ch.notebook).exists()}
    if not files:
        raise FileNotFoundError(f"no chapter notebooks in {notebooks}")
    zh_files = {n: notebooks / "zh" / f.name for n, f in files.items() if (notebooks / "zh" / f.name).exists()}
    present, translated = sorted(files), set(zh_files)
    if out.exists():
        shutil.rmtree(out)
    (out / "zh").mkdir(parents=True)
    pages = []
    by_number = {ch.number: ch for ch in CHAPTERS}
    for n in present:
        head, body = render_notebook(files[n])
        name = page_name(by_number[n])
        switch = language_switch(f"zh/{name}" if n in translated else "zh/index.html", zh=False)
        page = out / name
        body = link_first_uses(body, zh=False)
        page.write_text(wrap(switch + body, head, sidebar(n, set(present)), prev_next(n, present)), encoding="utf-8")
        pages.append(page)
    for n in sorted(translated):
        head, body = render_notebook(zh_files[n])
        name = page_name(by_number[n])
        page = out / "zh" / name
        body = link_first_uses(body, zh=True, href="../glossary.html")
        page.write_text(wrap(language_switch(f"../{name}", zh=True) + body, head,
                             sidebar(n, set(present), True, translated), prev_next(n, sorted(translated), True)),
                        encoding="utf-8")
        pages.append(page)
    for zh in (False, True):
        page = out / ("zh" if zh else "") / "index.html"
        page.write_text(index_page(set(present), zh, translated), encoding="utf-8")
        pages.append(page)
    for source, name, title, render in ((CORRECTIONS, "corrections.html", "Seed corrections", markdown_page),
                                        (GLOSSARY, "glossary.html", "Glossary · 术语表", lambda _: glossary_page())):
        if source.exists():
            page = out / name
            page.write_text(wrap(render(source), f"<title>{title}</title>", sidebar(None, set(present))),
                            encoding="utf-8")
            pages.append(page)
    return pages


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.site", description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output-dir", default=str(REPO / "site"), help="default: site/")
    args = p.parse_args(argv)
    pages = build(Path(args.output_dir))
    print(f"wrote {len(pages)} pages to {args.output_dir}/ (open index.html)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
