"""The language a kernel speaks: messages the library prints (gettext) and the font figures are drawn in.

    from course.i18n import _           # _("Task {task}") is the English text, or its catalog translation
    lang()                              # "zh" in a Chinese-edition kernel, else "en"
    gettext.dgettext("zero_lab", "total")   # in zero_ref and sim: the standard library's gettext

A kernel speaks Chinese when ``ZERO_LAB_LANG=zh`` (what ``course.build --lang zh`` and grading set) or when
it runs a notebook in a folder named ``zh`` (jupyter_server names the notebook in ``JPY_SESSION_NAME``; else
the kernel's working folder), so a student's ``work/zh/`` chapters need no extra cell. Catalogs are gettext ``.po`` files in
``course/locale/<lang>/LC_MESSAGES/zero_lab.po``, compiled by Babel when first used; a message with no
translation stays English. A Chinese kernel binds the domain (``bind``), so the library below course, which
imports nothing of it, translates with the standard ``gettext.dgettext("zero_lab", ...)``. In Chinese, matplotlib draws with Noto Sans CJK SC (the ``mplfonts`` package
ships it; a system-wide Noto CJK, e.g. Debian's fonts-noto-cjk, serves as well), DejaVu Sans kept first so
Latin letters, digits and symbols look as in the English figures.
"""
from __future__ import annotations

import gettext
import importlib.util
import io
import os
from functools import cache
from pathlib import Path

LOCALE = Path(__file__).resolve().parent / "locale"
DOMAIN = "zero_lab"
LANGS = ("en", "zh")
CJK_FONT = "Noto Sans CJK SC"


def lang() -> str:
    """The kernel's language: ``ZERO_LAB_LANG`` if set, else ``zh`` for a notebook in a folder named ``zh``."""
    chosen = os.environ.get("ZERO_LAB_LANG")
    if chosen:
        if chosen not in LANGS:
            raise ValueError(f"ZERO_LAB_LANG={chosen!r}: the course speaks {', '.join(LANGS)}")
        return chosen
    session = os.environ.get("JPY_SESSION_NAME")  # the notebook's path, where jupyter_server started the kernel
    folder = Path(session).parent if session else Path.cwd()  # else the kernel's folder: the notebook's
    return "zh" if folder.name == "zh" else "en"


def catalog_path(language: str) -> Path:
    return LOCALE / language / "LC_MESSAGES" / f"{DOMAIN}.po"


@cache
def translations(language: str) -> gettext.NullTranslations:
    """The compiled catalog of ``language`` (English: no catalog, every message as written)."""
    path = catalog_path(language)
    if language == "en" or not path.exists():
        return gettext.NullTranslations()
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        catalog = read_po(f, locale=language)
    buf = io.BytesIO()
    write_mo(buf, catalog)
    buf.seek(0)
    return gettext.GNUTranslations(buf)


def _(message: str) -> str:
    """``message`` in the kernel's language (a ``str.format`` template keeps its fields)."""
    return translations(lang()).gettext(message)


def bind(language: str) -> Path:
    """Make the standard ``gettext.dgettext(DOMAIN, ...)`` answer in ``language`` in this process: the way
    zero_ref and sim, which import nothing of course, print in the reader's language. The catalog is compiled
    (Babel) into a folder named after its content under the temporary directory; returns that folder."""
    import hashlib
    import tempfile

    po = catalog_path(language)
    digest = hashlib.sha256(po.read_bytes()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"zero-lab-locale-{digest}"
    mo = folder / language / "LC_MESSAGES" / f"{DOMAIN}.mo"
    if not mo.exists():
        from babel.messages.mofile import write_mo
        from babel.messages.pofile import read_po

        mo.parent.mkdir(parents=True, exist_ok=True)
        with po.open("rb") as f:
            catalog = read_po(f, locale=language)
        part = mo.with_suffix(f".{os.getpid()}")
        with part.open("wb") as f:
            write_mo(f, catalog)
        part.replace(mo)  # atomic: two kernels starting at once never read half a file
    gettext.bindtextdomain(DOMAIN, str(folder))
    os.environ["LANGUAGE"] = language  # gettext's first choice of language (dgettext reads it)
    return folder


def cjk_font_file() -> Path | None:
    """Noto Sans CJK SC as the ``mplfonts`` package ships it (found without importing that package)."""
    spec = importlib.util.find_spec("mplfonts")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "fonts" / "NotoSansCJKsc-Regular.otf"
        if path.exists():
            return path
    return None


def use_cjk_font() -> str:
    """Make matplotlib draw Chinese: register Noto Sans CJK SC and put it after DejaVu Sans; returns the
    family. Raises when no such font is installed (a figure would show empty boxes instead of hanzi)."""
    import matplotlib
    from matplotlib import font_manager

    path = cjk_font_file()
    if path is not None:
        font_manager.fontManager.addfont(str(path))
    names = {f.name for f in font_manager.fontManager.ttflist}
    if CJK_FONT not in names:
        raise RuntimeError(f"no {CJK_FONT} font: install the course's requirements (pip install mplfonts) "
                           "or the system's Noto CJK fonts (apt-get install fonts-noto-cjk)")
    # a list of families, not "sans-serif": matplotlib falls back glyph by glyph only along the family list
    matplotlib.rcParams["font.family"] = ["DejaVu Sans", CJK_FONT]
    matplotlib.rcParams["axes.unicode_minus"] = True
    return CJK_FONT


def activate() -> str:
    """Set up the kernel for its language (the CJK font in Chinese); returns the language."""
    language = lang()
    if language == "zh":
        bind(language)
        use_cjk_font()
    return language
