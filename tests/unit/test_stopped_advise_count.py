"""advise and live count stopped by a signal still write their report (docs/advise.md, docs/launches.md): the
partial report is built from real H200 records and results (fixtures/data), as a stop would have left them;
it says `stopped`, exits as the process does (128 + the signal), recommends nothing, and round-trips."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pytest

from graphdoctor.advise import AdviseReport, AdviseRun, plan
from graphdoctor.advise.rank import NOT_RUN, RAN, REJECTED
from graphdoctor.advise.session import AdviseSession
from graphdoctor.config import DiffConfig
from graphdoctor.count import CountReport
from graphdoctor.envelope import open_envelope
from graphdoctor.errors import Stopped, stopped_exit_code
from graphdoctor.parent.children import never_started, work_directory
from graphdoctor.parent.stopping import partial_report_on_stop
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import EAGER
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.report.advise import render_text
from graphdoctor.report.count import render_count_text, write_count_json
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.types import Diagnosis
from tests.unit.recorded import as_recorded
from tests.unit.test_count_live import recorded

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "advise"


def _advise_run(tmp_path: Path) -> tuple[AdviseRun, AdviseReport]:
    """An AdviseRun on the recorded dense fp32 advise's configuration, nothing run yet."""
    recorded_report = AdviseReport.from_dict(json.loads((DATA / "h200_advise_dense_fp32.json").read_text()))
    facts = EnvironmentFacts(torch_version="2.11.0", gpu_capability=(9, 0), te_version=None)
    screenings = plan(recorded_report.config, facts=facts)
    session = AdviseSession(recorded_report.config, tmp_path)
    return AdviseRun(session, screenings, max_candidates=32, facts=facts, env={}), recorded_report


def test_signal_names_give_the_shell_exit_codes() -> None:
    assert stopped_exit_code("SIGTERM") == 143 and stopped_exit_code("SIGINT") == 130
    assert stopped_exit_code("SIGHUP") == 129 and stopped_exit_code("no such signal") == 143


def test_advise_stopped_after_one_candidate_keeps_it_and_recommends_nothing(tmp_path: Path) -> None:
    run, recorded_report = _advise_run(tmp_path)
    judged = recorded_report.result_of(next(s.candidate for s in run.screenings if s.candidate.key == "full_iteration"))
    assert judged is not None and judged.status == RAN
    run.reference, run.results = recorded_report.reference, {"full_iteration": judged}
    report = run.stopped_report("SIGTERM")
    by_key = {r.candidate.key: r for r in report.results}
    assert by_key["full_iteration"] is judged
    assert by_key["local-layer"].status == NOT_RUN and by_key["local-layer"].reason == "not run: stopped by SIGTERM"
    assert {by_key[k].status for k in ("local-attn", "local-mlp")} == {REJECTED}  # screening needs no run
    assert report.recommendation.candidate is None
    assert report.recommendation.reason == "stopped by SIGTERM after 1 of 2 runnable candidates were judged: " \
                                           "no recommendation"
    assert report.exit_code() == 143 and report.stopped == "SIGTERM"
    text = render_text(report)
    assert "recommendation: none: stopped by SIGTERM" in text and "not run (stopped by SIGTERM): " in text
    again = AdviseReport.from_dict(report.to_dict())
    assert again.stopped == "SIGTERM" and again.exit_code() == 143
    assert [r.status for r in again.results] == [r.status for r in report.results]


def test_advise_stopped_before_anything_ran_has_a_stopped_reference(tmp_path: Path) -> None:
    run, _ = _advise_run(tmp_path)
    report = run.stopped_report("SIGINT")
    assert report.reference is not None and report.reference.status == "stopped"
    assert report.reference.diagnosis is not None and "before it started" in report.reference.diagnosis.message
    assert all(r.status in (NOT_RUN, REJECTED) for r in report.results)
    assert report.exit_code() == 130


def test_count_stopped_mid_run_reports_each_run_as_left(tmp_path: Path) -> None:
    full = recorded()
    cut = dataclasses.replace(full.runs[0], status="stopped", steps=full.runs[0].steps[:3])
    report = dataclasses.replace(full, runs=(cut, never_started(full.runs[1].impl, 0.1, "SIGTERM")),
                                 stopped="SIGTERM")
    text = render_count_text(report)
    assert "stopped by SIGTERM: a partial count, the runs as the stop left them" in text
    assert f"{full.runs[1].impl}: stopped: stopped by SIGTERM with graphdoctor before it started" in text
    assert text.rstrip().endswith("exit code 143")
    data = json.loads(write_count_json(report, tmp_path / "c.json").read_text())
    assert data["stopped"] == "SIGTERM" and data["exit_code"] == 143
    assert [(e["status"], e["steps_done"]) for e in data["impls"]][:2] == [("stopped", 3), ("stopped", 0)]
    assert CountReport(config=full.config, eager=full.eager, runs=full.runs, unavailable={}).exit_code() == 0


def test_never_started_record_round_trips() -> None:
    record = never_started(EAGER, 0.0, "SIGHUP")
    assert RunRecord.from_dict(record.to_dict()) == record


def test_a_stop_leaves_with_the_partial_report_and_nothing_else_gets_one() -> None:
    with pytest.raises(Stopped) as stop:
        with partial_report_on_stop(lambda signal_name: f"how far it got ({signal_name})"):
            raise Stopped(signal.SIGHUP)
    assert stop.value.report == "how far it got (SIGHUP)" and stop.value.exit_code == 129
    with pytest.raises(ValueError):
        with partial_report_on_stop(lambda signal_name: pytest.fail("built for an error that is no stop")):
            raise ValueError("a failing child is not a stop")


def test_work_directory_is_removed_only_when_it_made_it(tmp_path: Path) -> None:
    with work_directory(None, "graphdoctor-test-") as made:
        (made / "events-x.jsonl").write_text("{}\n")
        assert made.is_dir() and made.name.startswith("graphdoctor-test-")
    assert not made.exists()
    given = tmp_path / "kept" / "work"
    with pytest.raises(Stopped):
        with work_directory(given, "graphdoctor-test-") as used:
            assert used == given and used.is_dir()  # made when missing
            raise Stopped(signal.SIGTERM)
    assert given.is_dir()  # the user's --workdir stays, stop or not


RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "data"


def test_recorded_stopped_pages_say_stopped_not_fail() -> None:
    """The partial reports the H200 wrote when SIGTERM stopped diff and advise after the eager run's fifth step
    (tests/gpu/test_stopped_gpu.py at 4f46ace): their pages carry a STOPPED badge, neither PASS nor FAIL."""
    from graphdoctor.report.advise_html import render_html
    from graphdoctor.report.html import render_payload

    diff_payload = json.loads((RECORDED / "diff" / "h200_stopped_sigterm_schema2.json").read_text())
    page = render_payload(diff_payload)
    assert 'id="overall" data-verdict="stopped">' in page and "STOPPED by SIGTERM (exit 143): partial report" in page
    assert "FAIL" not in page.split('id="overall"')[1].split("</span>")[0]
    advise = AdviseReport.from_dict(json.loads((RECORDED / "advise" / "h200_advise_stopped_sigterm.json").read_text()))
    assert advise.stopped == "SIGTERM" and advise.exit_code() == 143 and advise.recommendation.candidate is None
    assert advise.reference is not None and advise.reference.status == "stopped" and len(advise.reference.steps) >= 5
    html = render_html(advise)
    assert 'data-verdict="stopped"' in html and "not run (stopped by SIGTERM)" in html
    assert "not run (stopped by SIGTERM): full_iteration whole step, local whole layer" in render_text(advise)


def test_recorded_stopped_count_document_is_written_again_by_the_stop_path() -> None:
    """The partial count the H200 wrote when SIGTERM stopped a live count in its eager run (fixtures/data/count),
    read back with the envelope reader and built again from what it records (the signal, the configuration, the
    eager run as the stop left it) with count's own stop path: each graphed run that never started is a
    never_started record, and CountReport writes the recorded runs, diagnoses and exit code again."""
    doc = open_envelope(json.loads((RECORDED / "count" / "h200_count_stopped_sigterm.json").read_text()),
                        legacy_command="count")
    assert doc.command == "count" and doc.schema_version == 2
    payload = doc.payload
    config = DiffConfig.from_dict(payload["config"])
    recorded_eager = payload["eager"]
    assert recorded_eager["status"] == "stopped" and recorded_eager["steps_done"] >= 5
    eager = RunRecord(impl=EAGER, dropout=config.dropout, status="stopped",
                      steps=tuple(StepRecord(step=i, phase="eager", loss=0.0, step_time_ms=0.0)
                                  for i in range(recorded_eager["steps_done"])),
                      diagnosis=Diagnosis.from_dict(recorded_eager["diagnosis"]))
    signal_name = payload["stopped"]
    report = CountReport(config=config, eager=eager, unavailable={}, stopped=signal_name,
                         runs=tuple(never_started(impl, config.dropout, signal_name) for impl in config.impls))
    again = report.to_dict()
    assert again["exit_code"] == payload["exit_code"] == 143 and report.exit_code() == stopped_exit_code("SIGTERM")
    assert (again["eager"]["status"], again["eager"]["steps_done"]) == ("stopped", recorded_eager["steps_done"])
    assert [(e["impl"], e["status"], e["steps_done"]) for e in again["impls"]] == [
        ("local", "stopped", 0), ("full_iteration", "stopped", 0)]
    for entry, recorded_entry in zip(again["impls"], payload["impls"], strict=True):
        # the recording predates the diagnosis fields added since; the ones it has are written again
        written = {**entry, "diagnosis": as_recorded(entry["diagnosis"], recorded_entry["diagnosis"])}
        assert written == recorded_entry
        assert "before it started" in entry["diagnosis"]["message"]
    text = render_count_text(report)
    assert "local: stopped: stopped by SIGTERM with graphdoctor before it started" in text
    assert text.rstrip().endswith("exit code 143")
