"""Fixtures of the course tests."""
import sys

import pytest


@pytest.fixture(autouse=True)
def no_figure_left_open():
    """Figures a test drew are closed after it: pyplot's open figures are global, and a later test counts them."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
