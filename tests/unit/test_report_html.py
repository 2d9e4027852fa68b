"""HTML diff report: the page content built from the recorded H200 reports as diff/report.py loads them, old and
partial reports, a self-contained page, and `graphdoctor report` / `diff --html` on the command line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.diff.report import DiffReport, TapRecording, load_saved, read_saved
from graphdoctor.errors import InputFileError
from graphdoctor.protocol import EAGER
from graphdoctor.report.html import render_file, render_payload
from graphdoctor.report.html_model import ReportView, compared_steps, control_run, graphed_run

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "data"
DIFF_REPORTS = sorted((FIXTURES / "diff").glob("*.json"))
TAP_TABLES = sorted((FIXTURES / "forensics").glob("*.json.gz"))
DEFAULT = FIXTURES / "diff" / "h200_default_dropout0.1.json"
MAX_PAGE_BYTES = 2 * 1024 * 1024


def _payload() -> dict:
    return json.loads(DEFAULT.read_text())


def test_fixture_reports_exist() -> None:
    assert len(DIFF_REPORTS) >= 2 and len(TAP_TABLES) >= 5


def _view(path: Path) -> ReportView:
    return ReportView.of(load_saved(path))


def test_default_report_view_matches_the_json() -> None:
    report = load_saved(DEFAULT)
    assert isinstance(report, DiffReport)
    view = ReportView.of(report)
    assert view.source == "diff" and view.exit_code == 0
    assert view.info.gpu == "NVIDIA H200" and view.info.dtype == "fp32" and view.info.dropout == 0.1
    assert view.reference is not None and view.reference.impl == EAGER and len(compared_steps(view.reference)) == 8
    local, full, te = view.impls
    assert (local.verdict, full.verdict, te.verdict) == ("rng-divergence", "match", "unavailable")
    assert local.control is not None and local.control.verdict == "match"
    assert local.divergence is not None and local.divergence.step == 1
    assert local.divergence.tensor == "embedding.word_embeddings.weight"
    assert local.memory is not None and local.memory.report is not None
    assert local.memory.report.graph_pool_reserved_bytes == 100663296
    assert local.launches is not None and local.launches.eager is not None
    assert local.launches.eager.num_host_launches == 658 and local.launches.graphed is not None
    assert local.launches.graphed.num_graph_launches == 8 and len(local.launches.census or ()) == 8
    assert local.launches.census_check is not None and local.launches.census_check.match is True
    control = control_run(local, view.info.dropout)
    assert control is not None and control.dropout == 0.0
    assert te.diagnosis is not None and te.diagnosis.fix and "Transformer Engine" in te.diagnosis.fix


@pytest.mark.parametrize("path", DIFF_REPORTS + TAP_TABLES, ids=lambda p: p.name)
def test_every_fixture_renders_self_contained(path: Path, tmp_path: Path) -> None:
    page = render_file(path, tmp_path / "page.html")
    html = page.read_text(encoding="utf-8")
    assert page.stat().st_size < MAX_PAGE_BYTES
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    for needle in ("http://", "https://", "<link", "src=", "@import", "url("):
        assert needle not in html, needle
    view = _view(path)
    for impl in view.impls:
        assert f'data-impl="{impl.impl}"' in html and f'data-verdict="{impl.verdict}"' in html
    if view.source == "diff":
        for section in ('id="loss"', 'id="numeric"', 'id="tensors"', 'id="memory"', 'id="launches"'):
            assert section in html
    assert ('id="forensics"' in html) == any(i.forensics is not None for i in view.impls)


def test_frozen_tap_table_names_the_site_and_rule(tmp_path: Path) -> None:
    path = FIXTURES / "forensics" / "h200_frozen_host_mask.json.gz"
    taps = load_saved(path)
    assert isinstance(taps, TapRecording) and taps.dropout == 0.0 and taps.settings()["num_layers"] == 2
    (impl,) = ReportView.of(taps).impls
    assert impl.verdict == "frozen-rng" and impl.diagnosis is not None and impl.diagnosis.rule == "GD506"
    assert impl.forensics is not None and len(impl.forensics.frozen) == 2
    html = render_file(path, tmp_path / "f.html").read_text()
    assert "FROZEN" in html and "fixtures/planted/host_mask_dropout.py:30" in html and "GD506" in html


def test_eager_spelling_missing_sections_and_newer_fields() -> None:
    payload = _payload()
    payload["reference"]["impl"] = "eager"
    payload["control_reference"] = None
    payload["future_section"] = {"x": 1}
    for impl in payload["impls"]:
        impl["new_field"] = [1, 2]
        for key in ("memory", "launches", "control", "timing"):
            impl.pop(key, None)
    del payload["env"]
    view = ReportView.of(read_saved(payload))
    assert view.reference is not None and view.reference.impl == EAGER
    assert all(i.memory is None and i.launches is None for i in view.impls)
    html = render_payload(payload)
    assert "Memory was not recorded" in html and "Launches were not profiled" in html
    assert "control pair: loss per step" not in html


def test_non_finite_strings_read_back_as_floats() -> None:
    payload = _payload()
    step = payload["impls"][0]["runs"][0]["steps"][1]
    step["loss"], step["grads"]["max_rel"] = "nan", "inf"
    view = ReportView.of(read_saved(payload))
    run = graphed_run(view.impls[0])
    assert run is not None and run.steps[1].loss != run.steps[1].loss
    assert run.steps[1].grads is not None and run.steps[1].grads.max_rel == float("inf")
    assert "<svg" in render_payload(payload)


def test_newer_schema_and_non_reports_are_refused() -> None:
    payload = _payload()
    payload["schema_version"] = 3
    with pytest.raises(InputFileError, match="schema_version 3 is newer"):
        read_saved(payload)
    with pytest.raises(InputFileError, match="not a graphdoctor diff report"):
        read_saved({"schema_version": 1})
    payload["schema_version"], payload["command"] = 2, "count"
    with pytest.raises(InputFileError, match="command: got 'count'"):
        read_saved(payload)


def test_in_memory_to_dict_shape_renders() -> None:
    # DiffReport.to_dict() keeps tuples and real floats (the writer turns them into lists/strings).
    payload = copy.deepcopy(_payload())
    payload["config"]["impls"] = tuple(payload["config"]["impls"])
    payload["impls"][0]["first_divergence"]["max_rel"] = float("inf")
    assert 'data-verdict="rng-divergence"' in render_payload(payload)


def _report(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["report", *args])
    return result.exit_code, result.stdout, result.stderr


def test_cli_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "r.html"
    code, stdout, _ = _report(str(DEFAULT), "--html", str(out))
    assert code == 0 and out.exists() and str(out) in stdout
    assert out.stat().st_size < MAX_PAGE_BYTES


@pytest.mark.parametrize("content, needle", [
    ("not json", "not valid JSON"),
    ('{"schema_version": 1}', "not a graphdoctor diff report"),
    ("[1, 2]", "top level is not an object"),
])
def test_cli_bad_file_is_one_line_exit_2(tmp_path: Path, content: str, needle: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code, stdout, stderr = _report(str(bad), "--html", str(tmp_path / "x.html"))
    assert code == 2 and needle in stderr and len(stderr.strip().splitlines()) == 1
    assert "Traceback" not in stderr and not (tmp_path / "x.html").exists()


def test_cli_missing_file_and_missing_html(tmp_path: Path) -> None:
    code, _, stderr = _report(str(tmp_path / "none.json"), "--html", str(tmp_path / "x.html"))
    assert code == 2 and "no such file" in stderr
    code, _, stderr = _report(str(DEFAULT))
    assert code == 2 and "--html" in stderr


def test_cli_never_overwrites_the_input(tmp_path: Path) -> None:
    copy_path = tmp_path / "r.json"
    copy_path.write_bytes(DEFAULT.read_bytes())
    code, _, stderr = _report(str(copy_path), "--html", str(copy_path))
    assert code == 2 and "refusing to overwrite" in stderr
    assert copy_path.read_bytes() == DEFAULT.read_bytes()


def test_diff_help_lists_html() -> None:
    result = CliRunner().invoke(main, ["diff", "--help"])
    assert result.exit_code == 0 and "--html PATH" in result.stdout


def test_diff_refuses_html_over_its_json_before_running(tmp_path: Path) -> None:
    same = str(tmp_path / "r.json")
    result = CliRunner().invoke(main, ["diff", "--json", same, "--html", same])
    assert result.exit_code == 2 and "same file as --json" in result.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_memory_section_without_its_snapshot_analysis_is_named() -> None:
    payload = _payload()
    for impl in payload["impls"]:
        if impl.get("memory"):
            impl["memory"] = {"stats": {}, "error": "snapshot failed"}
    html = render_payload(payload)
    assert "no snapshot analysis: snapshot failed" in html and "Memory was not recorded" not in html
