"""Rendering of a DiffReport built from records recorded on the H200; the JSON schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.compare.verdict import judge
from graphdoctor.config import DiffConfig
from graphdoctor.diff import SCHEMA_VERSION, DiffReport
from graphdoctor.diff.decide import _unavailable
from graphdoctor.protocol.record import RunRecord
from graphdoctor.report.diff import json_safe, render_text, write_json

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"


def build_report(strict_rng: bool = False) -> DiffReport:
    data = json.loads((DATA / "h200_default_dropout0.1.json").read_text(encoding="utf-8"))
    reference = RunRecord.from_dict(data["reference"])
    control_ref = RunRecord.from_dict(data["control_reference"])
    results = []
    for entry in data["impls"]:
        runs = [RunRecord.from_dict(r) for r in entry.get("runs", [])]
        if not runs:
            results.append(_unavailable(entry["impl"], "transformer_engine is not installed"))
            continue
        control = runs[1] if len(runs) > 1 else None
        results.append(judge(reference, runs[0], warmup_steps=2,
                             control_reference=control_ref if control else None,
                             control_graphed=control))
    return DiffReport(config=DiffConfig(strict_rng=strict_rng), results=tuple(results),
                      reference=reference, control_reference=control_ref, wall_s=75.6,
                      child_wall_s=75.6)


def test_text_summary_has_one_row_per_impl() -> None:
    text = render_text(build_report())
    lines = text.splitlines()
    assert lines[0].startswith("graphdoctor diff: GPTModel 4x256")
    assert any(line.startswith("local ") and "rng-divergence" in line for line in lines)
    assert any(line.startswith("full_iteration ") and "match" in line for line in lines)
    assert any(line.startswith("transformer_engine ") and "unavailable" in line for line in lines)
    assert "local: control pair at dropout 0: match" in text
    assert text.rstrip().endswith("exit code 0")


def test_exit_codes() -> None:
    assert build_report().exit_code() == 0
    assert build_report(strict_rng=True).exit_code() == 1


def test_json_schema(tmp_path: Path) -> None:
    path = write_json(build_report(), tmp_path / "sub" / "report.json")
    text = path.read_text(encoding="utf-8")
    assert "Infinity" not in text and "NaN" not in text
    data = json.loads(text)
    assert data["schema_version"] == SCHEMA_VERSION
    assert {"config", "env", "exit_code", "reference", "impls", "wall_s"} <= set(data)
    impls = {entry["impl"]: entry for entry in data["impls"]}
    assert impls["local"]["verdict"] == "rng-divergence"
    assert impls["local"]["first_divergence"]["step"] == 1
    assert impls["full_iteration"]["verdict"] == "match"
    assert impls["transformer_engine"]["diagnosis"]["fix"]
    for entry in data["impls"]:
        assert {"impl", "verdict", "passed", "diagnosis", "timing", "memory"} <= set(entry)
        if entry["diagnosis"]:
            assert {"module", "location", "step", "phase"} <= set(entry["diagnosis"])


@pytest.mark.parametrize(("value", "expected"), [
    (float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf"), (1.5, 1.5),
    ({"a": [float("inf"), 1]}, {"a": ["inf", 1]}),
])
def test_json_safe(value: Any, expected: Any) -> None:
    assert json_safe(value) == expected
