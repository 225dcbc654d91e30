"""Driving the course's widgets in JupyterLab with headless Chromium, for tests/notebooks/test_browser.py.

``serve`` starts `make lab` on a folder of chapter copies; ``drive_chapter`` opens one chapter, runs all
its cells and moves each explorer's controls, one update at a time, as a person would (arrow keys on a
slider, another option in a dropdown, a click on a checkbox). After each update has settled it asks the
kernel to draw the explorer again, alone, with the values the controls now hold, and compares: the
figures the browser shows must be exactly those (same count, same PNG bytes), none blank, and no error
printed. Two updates drawn into each other, a blank or half-drawn figure or a second figure in one
output all fail that comparison. Screenshots of each step go to ``shots``.
"""
from __future__ import annotations

import base64
import io
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from tests.helpers import free_port

from tests.helpers import ROOT as REPO
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "zero-lab-browser-test"
UPDATES_PER_WIDGET = 4


def widget_chapters() -> list[str]:
    """Every chapter notebook that shows an explorer (a code cell calling ``interactive(``)."""
    import json
    found = []
    for nb in sorted((REPO / "notebooks").glob("ch*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        if any(c["cell_type"] == "code" and re.search(r"\binteractive\(", "".join(c["source"])) for c in cells):
            found.append(nb.name)
    return found


def wait_http(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer {url}")


@contextmanager
def serve(folder: Path, log: Path, overrides: bool = True):
    """`make lab` on ``folder`` with a known token; yields the base URL. The JupyterLab settings are the
    project's (scripts/jupyter_lab_overrides.json), or JupyterLab's own with ``overrides=False``."""
    settings = folder.parent / "lab-settings"
    settings.mkdir(exist_ok=True)
    if overrides:
        shutil.copy(REPO / "scripts" / "jupyter_lab_overrides.json", settings / "overrides.json")
    port = free_port()
    # expose_app_in_browser: the test runs JupyterLab's own commands (window.jupyterapp), as its menus do.
    args = (f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={TOKEN} "
            f"--LabApp.expose_app_in_browser=True --LabApp.app_settings_dir={settings} "
            f"--LabApp.workspaces_dir={settings}")
    proc = subprocess.Popen(["make", "-s", "lab", f"NOTEBOOK_DIR={folder}", f"LAB_ARGS={args}"], cwd=REPO,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/status?token={TOKEN}", time.monotonic() + 300)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


NOTEBOOK = "window.jupyterapp && window.jupyterapp.shell.currentWidget"
KERNEL = f"{NOTEBOOK}.sessionContext.session.kernel"
READY = f"""() => {{ const w = {NOTEBOOK}; return !!(w && w.context && w.context.isReady && w.content
    && w.content.widgets.length > 3 && w.sessionContext.session && w.sessionContext.session.kernel
    && w.sessionContext.session.kernel.status === 'idle'); }}"""
CODE_CELLS = f"{NOTEBOOK}.content.widgets.filter(c => c.model.type === 'code')"
ALL_RUN = f"""() => {{ const w = {NOTEBOOK};
    return w.sessionContext.session.kernel.status === 'idle'
        && {CODE_CELLS}.every(c => c.model.executionCount !== null); }}"""
ERRORS = f"""() => {CODE_CELLS}.filter(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'))
    .map(c => c.model.sharedModel.getSource().slice(0, 60))"""
# Runs Python in the chapter's kernel and returns the PNGs and the error it displayed (not shown in the notebook).
EXECUTE = f"""async code => {{ const f = {KERNEL}.requestExecute({{code, store_history: false}});
    const out = {{png: [], error: null}};
    f.onIOPub = m => {{ const t = m.header.msg_type;
        if ((t === 'display_data' || t === 'execute_result') && m.content.data['image/png'])
            out.png.push(m.content.data['image/png'].replace(/\\s/g, ''));
        if (t === 'error') out.error = m.content.ename + ': ' + m.content.evalue; }};
    await f.done; return out; }}"""
# The explorer number k, drawn again alone with the values its controls hold now.
REDRAW = """import ipywidgets as _ipw
_zl = [w for w in list(_ipw.widgets.widget._instances.values()) if isinstance(w, _ipw.interactive)][{k}]
_zl.f(**_zl.kwargs)"""
# What one explorer's output shows now: its figures and whether it printed an error.
SHOWN = """el => ({png: [...el.querySelectorAll('.widget-output img')].map(i => i.src.replace(/^data:image\\/png;base64,/, '')
    .replace(/\\s/g, '')), error: [...el.querySelectorAll('.widget-output [data-mime-type="application/vnd.jupyter.stderr"],'
    + '.widget-output [data-mime-type="application/vnd.jupyter.error"]')].map(e => e.innerText.slice(-300)).join('\\n'),
    html: el.querySelector('.widget-output').innerHTML.length + ':' + el.querySelector('.widget-output').innerText})"""
# Disables the draw lock in the kernel (both modules hold it by name): only for showing what the test catches.
UNLOCK = """import contextlib, course.widgets, sim.views.widgets
course.widgets.DRAW_LOCK = sim.views.widgets.DRAW_LOCK = contextlib.nullcontext()"""


def url(base: str, chapter: str) -> str:
    """The chapter in a workspace of its own, reset: JupyterLab would otherwise reopen every notebook another
    page left open, and the page's current notebook would be one of those."""
    return f"{base}/lab/workspaces/{chapter.split('.')[0]}/tree/{chapter}?reset&token={TOKEN}"


def blank(png_b64: str) -> bool:
    """A figure with (nearly) nothing drawn: one colour over 99.5 % of it, or under 8 colours in all."""
    im = Image.open(io.BytesIO(base64.b64decode(png_b64))).convert("RGB")
    colors = im.getcolors(maxcolors=1 << 20) or []
    top = max((n for n, _ in colors), default=0)
    return len(colors) < 8 or top > 0.995 * im.width * im.height


@dataclass
class Report:
    chapter: str
    errors: list = field(default_factory=list)       # cells that raised on Run All
    updates: int = 0
    broken: list = field(default_factory=list)       # (update, what was wrong)
    seconds: float = 0.0


def into_view(page, el) -> None:
    """Scroll the explorer to the top of the notebook's view. JupyterLab skips drawing cells out of view
    (windowing mode "contentVisibility"), and Playwright counts their elements as invisible."""
    el.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(200)


def settle(page, el, timeout_s: float = 90) -> None:
    """Wait until the kernel is idle and the explorer's output has stopped changing for 0.8 s."""
    deadline, last, since = time.monotonic() + timeout_s, None, time.monotonic()
    page.wait_for_timeout(300)
    while time.monotonic() < deadline:
        now = el.evaluate("el => el.querySelector('.widget-output').innerHTML")
        idle = page.evaluate(f"() => {KERNEL}.status === 'idle'")
        if now != last or not idle:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > 0.8:
            return
        page.wait_for_timeout(200)
    raise TimeoutError("the explorer's output did not settle")


def update(page, el, i: int) -> str:
    """The i-th update of an explorer: its controls in turn, each moved as a person would; says what it did."""
    controls = el.locator(":scope > .widget-slider, :scope > .widget-dropdown, :scope > .widget-checkbox, "
                          ":scope .widget-gridbox > *, :scope .widget-hbox > *")
    controls = [c for c in controls.all() if c.locator(".noUi-handle, select, input[type=checkbox]").count()]
    c = controls[i % len(controls)]
    label = c.locator(".widget-label").first.inner_text() if c.locator(".widget-label").count() else "?"
    if c.locator(".noUi-handle").count():
        handle = c.locator(".noUi-handle").first
        handle.focus()
        at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
        key = "ArrowLeft" if at_max or (i // len(controls)) % 2 else "ArrowRight"
        page.keyboard.press(key)
        return f"{label} {key}"
    if c.locator("select").count():
        sel = c.locator("select").first
        options = sel.evaluate("s => [...s.options].map(o => o.value)")
        now = sel.evaluate("s => s.value")
        nxt = options[(options.index(now) + 1 + i // len(controls)) % len(options)]
        sel.select_option(nxt)
        return f"{label} → {nxt}"
    c.locator("input[type=checkbox]").first.click()
    return f"{label} toggled"


def drive_chapter(base: str, chapter: str, shots: Path, race: bool = False,
                  updates: int = UPDATES_PER_WIDGET) -> Report:
    """Open a chapter, Run All, then ``updates`` updates per explorer, each checked against the kernel's own
    drawing (see the module's docstring). ``race``: the draw lock is turned off first."""
    from playwright.sync_api import sync_playwright
    rep, t0, stem = Report(chapter), time.monotonic(), chapter.split("_")[0]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url(base, chapter))
            page.wait_for_function(READY, timeout=240_000)
            if race:
                page.evaluate(EXECUTE, UNLOCK)
            for command in ("notebook:clear-all-cell-outputs", "notebook:run-all-cells"):
                page.evaluate(f"() => window.jupyterapp.commands.execute('{command}')")
            page.wait_for_function(ALL_RUN, timeout=600_000, polling=500)
            rep.errors = page.evaluate(ERRORS)
            explorers = page.locator(".widget-interact").all()
            for k, el in enumerate(explorers):
                into_view(page, el)
                settle(page, el)  # its first drawing, on display
                el.screenshot(path=str(shots / f"{stem}_w{k}_0.png"))
                for i in range(updates):
                    into_view(page, el)
                    what = update(page, el, i)
                    settle(page, el)
                    rep.updates += 1
                    into_view(page, el)
                    el.screenshot(path=str(shots / f"{stem}_w{k}_{i + 1}.png"))
                    wrong = check(page, el, k)
                    if wrong:
                        rep.broken.append((f"explorer {k} update {i + 1} ({what})", wrong))
            page.screenshot(path=str(shots / f"{stem}_end.png"), full_page=False)
        finally:
            browser.close()
    rep.seconds = time.monotonic() - t0
    return rep


def check(page, el, k: int) -> str | None:
    """What is wrong with explorer k's output now, or None: compared with the kernel drawing it again alone."""
    shown = el.evaluate(SHOWN)
    if shown["error"]:
        return f"error printed: {shown['error']}"
    want = page.evaluate(EXECUTE, REDRAW.format(k=k))
    if want["error"]:
        return f"drawing alone raised {want['error']}"
    if len(shown["png"]) != len(want["png"]):
        return f"{len(shown['png'])} figures shown, the kernel draws {len(want['png'])}"
    if any(blank(b) for b in shown["png"]):
        return "a blank figure"
    if shown["png"] != want["png"]:
        return "the figure shown differs from the kernel's drawing of the same values"
    return None
