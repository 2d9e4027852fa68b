"""Saved diff reports load as typed DiffReports: schema 1 (recorded on the H200 before the child
protocol) and schema 2 (recorded on the H200 with it); what loads writes back the same JSON. Recorded
tap tables load as TapRecordings through the same loader; other graphdoctor documents are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphdoctor.diff import SCHEMA_VERSION, DiffReport, load_report
from graphdoctor.diff.report import TapRecording, load_saved
from graphdoctor.errors import InputFileError
from graphdoctor.protocol import EAGER
from graphdoctor.strict_json import json_safe

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"
REPORTS = sorted(DATA.glob("*.json"))
TAP_TABLES = sorted((DATA.parent / "forensics").glob("*.json.gz"))


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.stem)
def test_every_recorded_report_loads_typed(path: Path) -> None:
    report = load_report(path)
    assert report.reference.impl == EAGER
    assert report.results and all(r.impl != "none" for r in report.results)
    for result in report.results:
        if result.launches is not None and result.launches.graphed is not None:
            assert result.launches.summary.startswith("host launches")
        if result.memory is not None and result.memory.report is not None:
            assert result.memory.summary is not None and result.memory.summary.startswith("memory ")


@pytest.mark.parametrize("path", [p for p in REPORTS if "schema2" in p.name], ids=lambda p: p.stem)
def test_schema2_reports_write_back_what_they_read(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema_version"] == SCHEMA_VERSION
    report = DiffReport.from_dict(data)
    again = json_safe(report.to_dict())
    # Later releases may add fields; every field that was read is written back unchanged.
    for key in ("config", "env", "reference", "control_reference", "exit_code", "impls"):
        _contained(data[key], again[key], key)


def _contained(old: object, new: object, where: str) -> None:
    if isinstance(old, dict):
        assert isinstance(new, dict), where
        for key, value in old.items():
            assert key in new, f"{where}.{key}"
            _contained(value, new[key], f"{where}.{key}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            _contained(a, b, f"{where}[{i}]")
    else:
        assert old == new, where


def test_schema1_reports_read_the_eager_run_and_the_memory_figures() -> None:
    report = load_report(DATA / "h200_default_dropout0.1.json")
    local = next(r for r in report.results if r.impl == "local")
    assert local.control is not None and local.control.verdict.value == "match"
    assert report.reference.env is not None and report.reference.env.gpu == "NVIDIA H200"


def test_a_file_that_is_not_a_report_is_one_clean_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 9}', encoding="utf-8")
    with pytest.raises(InputFileError, match="not a graphdoctor diff report"):
        load_report(bad)


@pytest.mark.parametrize("path", TAP_TABLES, ids=lambda p: p.name)
def test_recorded_tap_tables_load_as_tap_recordings(path: Path) -> None:
    taps = load_saved(path)
    assert isinstance(taps, TapRecording) and taps.command.startswith("diff(DiffConfig(")
    assert taps.result.impl in ("local", "transformer_engine") and not taps.result.runs
    assert taps.result.forensics is not None or taps.result.divergence is not None
    assert taps.recorded.startswith("H200") and isinstance(taps.settings()["hidden_size"], int)
    with pytest.raises(InputFileError, match="not a graphdoctor diff report"):
        load_report(path)


def test_load_saved_reads_a_diff_report_as_load_report_does() -> None:
    path = DATA / "h200_default_dropout0.1_schema2.json"
    assert load_saved(path) == load_report(path)


def test_another_commands_document_is_refused() -> None:
    count = DATA.parent / "count" / "h200_count_stopped_sigterm.json"
    with pytest.raises(InputFileError, match="command: got 'count', expected 'diff'"):
        load_saved(count)


def test_taps_inside_the_graphs_are_counted_in_the_launch_table_and_kept_in_the_json() -> None:
    """A graphed run that carried taps (dropout > 0 by default) says how many of its graphs' nodes are the taps'."""
    import dataclasses

    from graphdoctor.launches.compare import LaunchComparison
    from graphdoctor.report.diff import launch_table

    report = next(r for r in map(load_report, REPORTS) if any(x.launches and x.launches.graphed for x in r.results))
    row = next(x for x in report.results if x.launches and x.launches.graphed)
    assert row.launches is not None and "graphdoctor's taps" not in launch_table(report)
    tapped = dataclasses.replace(row.launches, tap_graph_nodes=412)
    report = dataclasses.replace(report, results=tuple(dataclasses.replace(x, launches=tapped) if x is row else x
                                                         for x in report.results))
    line = next(line for line in launch_table(report).splitlines() if "graphdoctor's taps" in line)
    assert "412" in line.split() and line.split()[5] == "-"  # the eager column has no taps in graphs
    assert tapped.summary.endswith("412 graph nodes are graphdoctor's taps")
    assert LaunchComparison.from_dict(tapped.to_dict()).tap_graph_nodes == 412
