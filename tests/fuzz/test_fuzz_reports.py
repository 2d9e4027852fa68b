"""Property: saved `graphdoctor diff --json` reports are read by the input layer's strict JSON.

graphdoctor has no loader of saved diff reports yet (issue 19 notes it); the reports under
fixtures/data/diff/ are read through graphdoctor.inputs.read_json, which any future loader will
use. Every broken report must raise InputFileError (or load), within 10 s; the recorded reports
must load unchanged.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import examples
from harness import TIME_LIMIT_S, record_in_process
from hostile import DIFF_REPORTS, report_bytes
from hypothesis import given, settings

from graphdoctor.errors import InputFileError
from graphdoctor.inputs import read_json


@pytest.mark.parametrize("path", DIFF_REPORTS, ids=lambda p: p.name)
def test_recorded_reports_load_unchanged(path: Path) -> None:
    assert read_json(path, "report") == json.loads(path.read_text(encoding="utf-8"))


@settings(settings.get_profile("fuzz"), max_examples=examples(150))
@given(case=report_bytes())
def test_broken_reports_are_clean_errors(tmp_path_factory: pytest.TempPathFactory, case: tuple[str, bytes]) -> None:
    label, data = case
    path = tmp_path_factory.mktemp("report") / "report.json"
    path.write_bytes(data)
    start = time.monotonic()
    try:
        read_json(path, "report")
        kind = "accepted"
    except InputFileError as exc:
        kind = "clean error"
        assert "\n" not in str(exc)
    wall_s = time.monotonic() - start
    record_in_process("report", label, kind, wall_s)
    assert wall_s < TIME_LIMIT_S
