"""The one JSON envelope (docs/json.md): schema_version, tool, command, then the payload; old
schema 1 documents (the recorded H200 diff reports) still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.envelope import SCHEMA_VERSION, envelope, open_envelope
from graphdoctor.errors import InputFileError, UsageError

REPO = Path(__file__).resolve().parents[2]
DIFF_REPORTS = sorted((REPO / "fixtures" / "data" / "diff").glob("*.json"))
TRACE = REPO / "fixtures" / "data" / "launches" / "synthetic_kineto_trace.json"


def head(document: dict[str, object]) -> list[str]:
    return list(document)[:3]


def test_envelope_orders_keys_and_replaces_legacy_identity() -> None:
    doc = envelope("count", {"schema_version": 1, "tool": "graphdoctor count", "exit_code": 0})
    assert head(doc) == ["schema_version", "tool", "command"]
    assert doc["schema_version"] == SCHEMA_VERSION == 2 and doc["command"] == "count" and doc["exit_code"] == 0
    assert doc["tool"]["name"] == "graphdoctor"
    with pytest.raises(UsageError):
        envelope("check", {"command": "x"})


@pytest.mark.parametrize("path", DIFF_REPORTS, ids=lambda p: p.name)
def test_old_diff_reports_still_load(path: Path) -> None:
    opened = open_envelope(json.loads(path.read_text(encoding="utf-8")), legacy_command="diff")
    # schema 1: recorded before the envelope; *_schema2: recorded on the H200 with it
    assert opened.schema_version == (2 if "schema2" in path.name else 1) and opened.command == "diff"
    assert {"config", "env", "exit_code", "reference", "impls"} <= set(opened.payload)
    again = open_envelope(envelope("diff", opened.payload), legacy_command="diff")
    assert again.schema_version == 2 and again.payload == opened.payload


def test_open_envelope_rejects_other_documents() -> None:
    with pytest.raises(InputFileError):
        open_envelope({"schema_version": 7}, legacy_command="diff")


@pytest.mark.parametrize(("args", "command"), [
    (["check", "examples/te_graphs.yaml", "--output-format", "json"], "check"),
    (["rules", "--format", "json"], "rules"),
    (["rule", "GD101", "--format", "json"], "rule"),
    (["env", "--json"], "env"),
])
def test_every_json_command_uses_the_envelope(monkeypatch: pytest.MonkeyPatch, args: list[str], command: str) -> None:
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert head(doc) == ["schema_version", "tool", "command"] and doc["command"] == command


def test_count_trace_json_uses_the_envelope() -> None:
    result = CliRunner().invoke(main, ["count", "--trace", str(TRACE), "--json", "-"])
    doc = json.loads(result.stdout)
    assert head(doc) == ["schema_version", "tool", "command"] and doc["command"] == "count"
