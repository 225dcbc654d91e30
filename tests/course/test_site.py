"""`python -m course.site` renders every chapter notebook into a static site with navigation."""
import re

import pytest

from course import site
from course.syllabus import CHAPTERS

pytestmark = pytest.mark.slow


@pytest.mark.browser  # what a reader's browser is served: run by make test-ui, beside the Chromium tests
def test_site_has_every_chapter_page_linked_and_rendered(tmp_path):
    pages = site.build(tmp_path / "site")
    present = [ch for ch in CHAPTERS if (site.NOTEBOOKS / ch.notebook).exists()]
    names = {p.name for p in pages}
    assert {site.page_name(ch) for ch in present} <= names and "index.html" in names
    index = (tmp_path / "site" / "index.html").read_text()
    for ch in CHAPTERS:  # the syllabus lists all thirty; chapters with a notebook are links
        assert f"<td>{ch.number}</td>" in index
        assert (f'href="{site.page_name(ch)}"' in index) == (ch in present)
    for i, ch in enumerate(present):
        page = (tmp_path / "site" / site.page_name(ch)).read_text()
        assert ch.title_zh in page and "zl-side" in page  # title cell rendered, sidebar present
        if i + 1 < len(present):
            assert f'href="{site.page_name(present[i + 1])}"' in page  # "next" link
    corrections = (tmp_path / "site" / "corrections.html").read_text()
    assert "<table>" in corrections and "(p − 1)/(m + p − 1)" in corrections  # course/seed_corrections.md
    # The Chinese edition: every English page links to its Chinese page, or to the Chinese syllabus where the
    # chapter is not translated yet; each Chinese page links back and lists the chapters by their Chinese titles.
    translated = [ch for ch in present if (site.NOTEBOOKS / "zh" / ch.notebook).exists()]
    for ch in present:
        page = (tmp_path / "site" / site.page_name(ch)).read_text()
        target = f"zh/{site.page_name(ch)}" if ch in translated else "zh/index.html"
        assert f'<div class="zl-lang"><a href="{target}">中文</a></div>' in page
    for ch in translated:
        page = (tmp_path / "site" / "zh" / site.page_name(ch)).read_text()
        assert f'<a href="../{site.page_name(ch)}">English</a>' in page and CHAPTERS[-1].title_zh.split("：")[0] in page
    zh_index = (tmp_path / "site" / "zh" / "index.html").read_text()
    assert all(ch.title_zh in zh_index for ch in CHAPTERS) and 'href="../index.html">English' in zh_index
    if site.GLOSSARY.exists():
        glossary = (tmp_path / "site" / "glossary.html").read_text()
        assert "显存" in glossary
        # each chapter page links the first use of glossary terms to rows that exist
        for page, prefix in ((site.page_name(present[1]), ""),
                             *((f"zh/{site.page_name(ch)}", "../") for ch in translated[:1])):
            links = re.findall(rf'class="zl-term" href="{re.escape(prefix)}glossary.html#([\w-]+)"',
                               (tmp_path / "site" / page).read_text())
            assert links and len(links) == len(set(links)), page  # some, each term once
            assert all(f'<tr id="{a}">' in glossary for a in links), page
    # Figures are embedded, so the site works from disk with no other files.
    memory = (tmp_path / "site" / "ch02_training_memory.html").read_text()
    assert re.search(r'<img[^>]+src="data:image/png;base64,', memory)


def test_glossary_links_go_to_the_first_use_in_prose_only():
    body = ('<h2>Gradients</h2><p>The optimizer states and <code>gradients</code> in GPU memory; gradients again,'
            ' $gradients$</p><pre>gradients</pre><li>gradients</li>')
    linked = site.link_first_uses(body, zh=False)
    assert linked.count('href="glossary.html#term-gradients"') == 1
    assert '<a class="zl-term" href="glossary.html#term-gradients">gradients</a> again' in linked  # not the code, heading
    assert "<code>gradients</code>" in linked and "$gradients$" in linked and "<pre>gradients</pre>" in linked
    assert 'href="glossary.html#term-gpu-memory-device-memory">GPU memory</a>' in linked
    zh = site.link_first_uses("<p>主权重在显存里；显存</p>", zh=True, href="../glossary.html")
    assert zh.count("../glossary.html#term-gpu-memory-device-memory") == 1 and "term-master-weights" in zh
