"""Course-wide check on the notebook run (`pytest --nbval notebooks/`): every chapter executes within
its time budget on a 2-core CPU machine. nbval reports each cell as a test; their call times add up
to the notebook's run time, and a chapter over budget fails the session with a table saying which.
"""
from collections import defaultdict
from pathlib import Path

import pytest

NOTEBOOK_BUDGET_S = 60.0
_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if report.when == "call" and path.endswith(".ipynb"):
        _seconds[Path(path).name] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _seconds:
        return
    slow = {name: s for name, s in _seconds.items() if s > NOTEBOOK_BUDGET_S}
    terminalreporter.section("notebook run times")
    for name, s in sorted(_seconds.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{s:6.1f} s  {name}{'  OVER BUDGET' if name in slow else ''}")
    if slow:
        terminalreporter.write_line(f"error: {len(slow)} notebook(s) take longer than {NOTEBOOK_BUDGET_S:g} s: "
                                    + ", ".join(sorted(slow)), red=True)


def pytest_sessionfinish(session, exitstatus):
    if any(s > NOTEBOOK_BUDGET_S for s in _seconds.values()) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
