"""`graphdoctor count --trace`: table, --json file and stdout, gzip input, tool errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from click.testing import CliRunner

from graphdoctor.cli import main

SYNTHETIC = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "launches" / "synthetic_kineto_trace.json"


def test_table_has_eager_and_graphed_columns() -> None:
    result = CliRunner().invoke(main, ["count", "--trace", str(SYNTHETIC)])
    assert result.exit_code == 0, result.output
    assert "toy eager" in result.output and "toy graphed" in result.output
    assert "of which RNG prologue fills" in result.output
    assert "6, 4" in result.output


def test_json_file_and_stdout(tmp_path: Path) -> None:
    out = tmp_path / "count.json"
    result = CliRunner().invoke(main, ["count", "--trace", str(SYNTHETIC), "--json", str(out)])
    assert result.exit_code == 0
    document = json.loads(out.read_text())
    # schema 2 by design: the one envelope of docs/json.md
    assert document["schema_version"] == 2 and document["command"] == "count"
    stdout = CliRunner().invoke(main, ["count", "--trace", str(SYNTHETIC), "--json", "-"])
    assert json.loads(stdout.output) == document


def test_gzip_trace(tmp_path: Path) -> None:
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(SYNTHETIC.read_bytes()))
    result = CliRunner().invoke(main, ["count", "--trace", str(packed), "--json", "-"])
    assert result.exit_code == 0
    assert json.loads(result.output)["total"]["num_graph_launches"] == 2


def test_bad_trace_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    result = CliRunner().invoke(main, ["count", "--trace", str(bad)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "graphdoctor: error: trace " in result.output


def test_trace_without_phases_falls_back_to_steps(tmp_path: Path) -> None:
    document = json.loads(SYNTHETIC.read_text())
    document["traceEvents"] = [e for e in document["traceEvents"] if not e.get("name", "").startswith("graphdoctor/")]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(document))
    result = CliRunner().invoke(main, ["count", "--trace", str(plain)])
    assert result.exit_code == 0
    assert "ProfilerStep#0" in result.output and "total" in result.output
