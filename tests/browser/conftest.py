"""Browser tests: one headless Chromium per module (skipped where none is installed, failed where CI requires
one), and the layout figures each measured page recorded, repeated as one table at the end of the run."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from chromium import Browser, find_chromium
from layout import FIGURES_KEY


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """A running headless Chromium; GRAPHDOCTOR_REQUIRE_BROWSER (.ci/run) turns its absence into a failure."""
    binary = find_chromium()
    if binary is None and os.environ.get("GRAPHDOCTOR_REQUIRE_BROWSER"):
        pytest.fail("GRAPHDOCTOR_REQUIRE_BROWSER is set (.ci/run) but no headless Chromium was found")
    if binary is None:
        pytest.skip("headless Chromium not found (apt-get install chromium-headless-shell; .ci/run does)")
    with Browser(binary) as running:
        yield running


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    figures = config.stash.get(FIGURES_KEY, [])
    if not figures:
        return
    terminalreporter.section("report layout in Chromium (widest overflow past a card, narrowest cell in a card)")
    for page_id, width, widest, cell in figures:
        narrow = f"{cell:5.1f} chars" if cell is not None else "    - (no table)"
        terminalreporter.write_line(f"{page_id:28} {width:5d} px   overflow {widest:7.1f} px   cell {narrow}")
