"""tests/gpu/kept.py, the GPU tests' report keeper, on a DiffReport built from records recorded on the H200:
every report lands under GD_REPORT_DIR named after the running test, later ones numbered."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from graphdoctor.compare.verdict import judge
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport
from graphdoctor.protocol.record import RunRecord

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import kept  # noqa: E402


def _report() -> DiffReport:
    data = json.loads((REPO / "fixtures" / "data" / "diff" / "h200_default_dropout0.1.json").read_text("utf-8"))
    reference = RunRecord.from_dict(data["reference"])
    graphed = RunRecord.from_dict(data["impls"][1]["runs"][0])
    result = judge(reference, graphed, warmup_steps=2)
    return DiffReport(config=DiffConfig(), results=(result,), reference=reference, wall_s=1.0, child_wall_s=1.0)


def test_reports_are_named_after_the_test_and_numbered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GD_REPORT_DIR", str(tmp_path))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/gpu/test_moe_gpu.py::test_local_attn[drop_pad] (call)")
    report = _report()
    text = kept.keep(report)
    kept.keep(report)
    kept.keep(report, "named")
    names = sorted(p.name for p in tmp_path.iterdir())
    stem = "test_moe_gpu__test_local_attn_drop_pad"
    assert set(names) == {"named.json", "named.txt", f"{stem}.json", f"{stem}.txt", f"{stem}-2.json", f"{stem}-2.txt"}
    assert json.loads((tmp_path / "named.json").read_text("utf-8"))["impls"][0]["impl"] == report.results[0].impl
    assert (tmp_path / "named.txt").read_text("utf-8").strip() == text.strip()


def test_nothing_is_written_without_gd_report_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GD_REPORT_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert kept.keep(_report()).startswith("graphdoctor diff:")
    assert list(tmp_path.iterdir()) == []
