"""The course in a real browser: the README's course command (`make lab`) serves JupyterLab, headless
Chromium opens chapter 1, runs every cell, moves a widget slider and sees the plot and the printed
verdict change. Screenshots land in ``$ZERO_LAB_SCREENSHOTS`` (default: the test's tmp folder).

Chromium is Debian's package (/usr/bin/chromium, installed by scripts/setup_env.sh where it can),
driven by Playwright for Python. JupyterLab works on a copy of the notebook, so its autosave never
touches the reference in notebooks/.
"""
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from _helpers import free_port

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHAPTER = "ch01_course_map.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is installed by requirements-dev.txt")


def wait_http(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer {url}")


@pytest.fixture
def lab(tmp_path):
    """`make lab` on a copy of the chapter, on a free port with a known token; yields the base URL."""
    if not os.path.exists(CHROMIUM):
        pytest.fail("Debian's chromium is missing: scripts/setup_env.sh installs it (apt-get install chromium)")
    work = tmp_path / "notebooks"
    work.mkdir()
    shutil.copy(REPO / "notebooks" / CHAPTER, work / CHAPTER)
    port, token = free_port(), "zero-lab-browser-test"
    # expose_app_in_browser: the test runs JupyterLab's own commands (window.jupyterapp), as its menus do.
    args = (f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token} "
            "--LabApp.expose_app_in_browser=True")
    proc = subprocess.Popen(["make", "-s", "lab", f"NOTEBOOK_DIR={work}", f"LAB_ARGS={args}"], cwd=REPO,
                            stdout=open(tmp_path / "lab.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", time.monotonic() + 120)
        yield f"http://127.0.0.1:{port}", token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


NOTEBOOK = "window.jupyterapp && window.jupyterapp.shell.currentWidget"
READY = f"""() => {{ const w = {NOTEBOOK}; return !!(w && w.context && w.context.isReady && w.content
    && w.content.widgets.length > 10 && w.sessionContext.session && w.sessionContext.session.kernel
    && w.sessionContext.session.kernel.status === 'idle'); }}"""
CODE_CELLS = f"{NOTEBOOK}.content.widgets.filter(c => c.model.type === 'code')"
ALL_RUN = f"""() => {{ const w = {NOTEBOOK};
    return w.sessionContext.session.kernel.status === 'idle'
        && {CODE_CELLS}.every(c => c.model.executionCount !== null); }}"""
ERRORS = f"""() => {CODE_CELLS}.filter(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'))
    .map(c => c.model.sharedModel.getSource().slice(0, 60))"""


def widget_state(page) -> tuple[str, str]:
    """The interactive explorer's printed verdict and its figure (the PNG's data URL)."""
    out = page.locator(".widget-interact .jp-OutputArea-output")
    text = out.filter(has=page.locator("pre")).last.inner_text()
    img = page.locator(".widget-interact img").last.get_attribute("src")
    return text, img


def test_chapter_runs_and_widget_updates_in_chromium(lab, tmp_path):
    base, token = lab
    shots = Path(os.environ.get("ZERO_LAB_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/lab/tree/{CHAPTER}?token={token}")
        # The notebook is open when its model is loaded and its kernel is idle (JupyterLab's own state,
        # read through window.jupyterapp: the DOM shows cells before the document is ready).
        page.wait_for_function(READY, timeout=240_000)
        page.screenshot(path=str(shots / "ch01_opened.png"))
        for command in ("notebook:clear-all-cell-outputs", "notebook:run-all-cells"):
            page.evaluate(f"() => window.jupyterapp.commands.execute('{command}')")
        # Run All is done when every code cell has a fresh execution count and the kernel is idle again.
        page.wait_for_function(ALL_RUN, timeout=300_000)
        page.screenshot(path=str(shots / "ch01_ran.png"))
        failed = page.evaluate(ERRORS)
        assert not failed, f"cells raised: {failed}"
        slider = page.locator(".widget-interact .widget-hslider .noUi-handle").first
        slider.wait_for(timeout=60_000)
        page.locator(".widget-interact").first.scroll_into_view_if_needed()
        # The explorer draws once on display: wait for its verdict and figure before moving it.
        page.wait_for_function(
            "() => { const o = [...document.querySelectorAll('.widget-interact .jp-OutputArea-output pre')];"
            " return o.length && o[o.length - 1].innerText.startsWith('Use ZeRO')"
            " && document.querySelector('.widget-interact img') !== null; }", timeout=120_000)
        before = widget_state(page)
        shown = page.locator(".widget-interact .widget-readout").first.inner_text()  # the value drawn first
        page.screenshot(path=str(shots / "ch01_before.png"))
        slider.focus()
        for _ in range(20):  # Ψ from 7.5B upwards: 20 steps of 0.05 in log10 → 75B
            page.keyboard.press("ArrowRight")
        page.wait_for_function(
            "old => { const o = [...document.querySelectorAll('.widget-interact .jp-OutputArea-output pre')];"
            " return o.length && o[o.length - 1].innerText !== old; }", arg=before[0], timeout=60_000)
        # Each key press re-runs the explorer; read the result once the kernel has caught up.
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        page.wait_for_timeout(1000)
        readout = page.locator(".widget-interact .widget-readout").first.inner_text()
        after = widget_state(page)
        page.screenshot(path=str(shots / "ch01_after.png"))
        browser.close()
    # course.widgets.log_slider's grid passes through the default, so the browser does not snap it elsewhere
    # (a bare slider showed 7.94 here); the readout is d3's ".3g", which keeps trailing zeros
    assert (shown, readout) == ("7.50", "75.0"), (shown, readout)  # 10 ** (log10(7.5) + 20 × 0.05)
    assert before[0].startswith("Use ZeRO stage") and after[0].startswith("No ZeRO stage fits"), (before[0], after[0])
    assert before[1] and after[1] and before[1] != after[1], "the figure did not change"
