"""The README's main-job block is the current code's output for a real GPU run: `render_text` of the saved report
(fixtures/data/diff/h100_readme_default.json.gz, `graphdoctor diff --json` with the defaults on an H100) gives
the block line for line, so a change to the terminal summary fails here until the README shows it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from graphdoctor.diff import DiffReport
from graphdoctor.report.diff import render_text, summary_rows

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "fixtures" / "data" / "diff" / "h100_readme_default.json.gz"


def _main_job_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The main job"):]
    start = section.index("```\n") + len("```\n")
    return section[start:section.index("```", start)]


def test_the_readme_block_is_what_the_code_prints_for_the_recorded_run() -> None:
    with gzip.open(REPORT, "rt", encoding="utf-8") as fh:
        report = DiffReport.from_dict(json.load(fh))
    assert _main_job_block().rstrip("\n") == render_text(report).rstrip("\n")


def test_a_row_not_run_here_is_marked_so_not_failed() -> None:
    """The recorded run had no Transformer Engine: its row reads `unavailable --` and the exit code stays 0."""
    with gzip.open(REPORT, "rt", encoding="utf-8") as fh:
        report = DiffReport.from_dict(json.load(fh))
    rows = {row[0]: row[1] for row in summary_rows(report)}
    unavailable = [row.impl for row in report.results if row.verdict.value == "unavailable"]
    assert unavailable, "the recorded run has an unavailable row"
    for impl in unavailable:
        assert rows[impl] == "unavailable --", rows[impl]
    assert report.exit_code() == 0
