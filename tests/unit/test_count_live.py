"""Live `graphdoctor count`: argument handling on CPU, and the report built from child records
recorded on the H200 (the same launch sections the live run produces)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.config import DiffConfig
from graphdoctor.count import CountReport
from graphdoctor.protocol.record import RunRecord
from graphdoctor.report.count import render_count_text, write_count_json

REPORT = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff" / \
    "h200_default_dropout0.1.json"


def recorded() -> CountReport:
    data = json.loads(REPORT.read_text(encoding="utf-8"))
    eager = RunRecord.from_dict(data["reference"])
    runs = tuple(RunRecord.from_dict(e["runs"][0]) for e in data["impls"] if e.get("runs"))
    return CountReport(config=DiffConfig(), eager=eager, runs=runs,
                       unavailable={"transformer_engine": "transformer_engine is not installed"})


def test_without_gpu_one_line() -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "graphdoctor.cli", "count"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0]


def test_trace_and_model_options_are_exclusive() -> None:
    result = CliRunner().invoke(main, ["count", "--trace", "x.json", "--num-layers", "2"])
    assert result.exit_code == 2
    assert "--num-layers: got a model option with --trace" in result.output


def test_table_and_json_from_recorded_runs(tmp_path: Path) -> None:
    report = recorded()
    text = render_count_text(report)
    assert "graph launches (cudaGraphLaunch)" in text
    assert "local: host launches 658 eager -> 380 graphed" in text
    assert "transformer_engine: unavailable" in text
    data = json.loads(write_count_json(report, tmp_path / "c.json").read_text(encoding="utf-8"))
    # schema 2 by design: the one envelope of docs/json.md
    assert data["schema_version"] == 2 and data["command"] == "count" and data["exit_code"] == 0
    impls = {e["impl"]: e for e in data["impls"]}
    assert impls["full_iteration"]["launches"]["census_check"]["match"]
    assert impls["local"]["launches"]["graphed"]["num_graph_launches"] == 8
    assert impls["transformer_engine"]["status"] == "unavailable"
