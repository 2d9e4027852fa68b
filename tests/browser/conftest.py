"""Browser tests: the layout figures each measured page recorded, repeated as one table at the end of the run."""

from __future__ import annotations

import pytest
from layout import FIGURES_KEY


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    figures = config.stash.get(FIGURES_KEY, [])
    if not figures:
        return
    terminalreporter.section("report layout in Chromium (widest overflow past a card, narrowest cell in a card)")
    for page_id, width, widest, cell in figures:
        narrow = f"{cell:5.1f} chars" if cell is not None else "    - (no table)"
        terminalreporter.write_line(f"{page_id:28} {width:5d} px   overflow {widest:7.1f} px   cell {narrow}")
