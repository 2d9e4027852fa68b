"""A failed eager reference: every implementation keeps its name in the table, the JSON and the page,
each "not run: the eager reference failed"; the reference's own failure is told once. The failure is
real: a loss-function return graphdoctor cannot read, raised by the child's check, written as the child
writes its error event and folded by the parent as it folds every child's events."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from graphdoctor.child.entry import ChildRun
from graphdoctor.child.loop import LoopState
from graphdoctor.child.reported import ACCEPTED_FORMS, read_loss_return
from graphdoctor.compare.verdict import REFERENCE_FAILED_NOTE
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffRun, load_report
from graphdoctor.parent.children import ChildRequest
from graphdoctor.parent.fold import record_from_events
from graphdoctor.parent.gpus import JobPlan
from graphdoctor.parent.runner import ProcessResult
from graphdoctor.protocol import EAGER, ChildSpec, EventWriter, Placement, Role, RunRecord, read_events, run_name
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.report.diff import render_text, write_json
from graphdoctor.report.html import render_payload
from graphdoctor.types import Diagnosis, Verdict
from tests.unit.sessions import DeferredSession

IMPLS = ("local", "full_iteration")
CONFIG = DiffConfig(impls=IMPLS, dropout=0.0, forward_step="pkg.mod:step")
WHERE = "--forward-step pkg.mod:step"


def failed_reference(tmp_path: Path) -> RunRecord:
    """The eager reference as the parent sees it after the child's check refused a return."""
    spec = ChildSpec(impl=EAGER, dropout=0.0, config=CONFIG, role=Role.REFERENCE,
                     name=run_name(EAGER, 0.0, Role.REFERENCE), events_path=str(tmp_path / "events.jsonl"),
                     reference_dir=str(tmp_path), placement=Placement(master_port=29999))
    events = EventWriter(spec.events_path)
    try:
        read_loss_return((torch.tensor(2.0), {"lm loss": 2.0}), WHERE)
    except Exception as exc:  # noqa: BLE001 - the child records whatever ends the run
        ChildRun(spec=spec, events=events, names={}).fail(exc, LoopState(step=0, phase="eager"))
    finally:
        events.close()
    ended = ProcessResult(returncode=3, timed_out=False, wall_s=4.0, log_tail="")
    return record_from_events(spec, read_events(spec.events_path), ended)


class Session(DeferredSession):
    """Hands out records instead of starting children: the reference as given; each implementation
    ran to the end (it ran beside the reference), which must not be judged."""

    def __init__(self, workdir: Path, reference: RunRecord) -> None:
        self.config, self.workdir, self.reference = CONFIG, workdir, reference
        self.plan = JobPlan(jobs=1, gpus=(), shared=False, reason="children run in series")
        self.child_wall_s = 0.0

    def run_request(self, request: ChildRequest) -> RunRecord:
        steps = tuple(StepRecord(step=i, phase="replay", loss=2.0, step_time_ms=1.0) for i in range(8))
        return self.reference if request.impl == EAGER else RunRecord(impl=request.impl, dropout=0.0, status="ok",
                                                                      steps=steps)


def test_the_failed_reference_is_a_usage_error_of_one_line(tmp_path: Path) -> None:
    reference = failed_reference(tmp_path)
    assert reference.status == "error" and reference.diagnosis is not None
    diag = reference.diagnosis
    assert diag.error_type == "UsageError" and (diag.step, diag.phase) == (0, "eager")
    assert diag.message == f"{WHERE}: its dict reports 'lm loss' as float, not a tensor; {ACCEPTED_FORMS}"


def test_every_implementation_keeps_its_name_in_the_table_and_the_json(tmp_path: Path) -> None:
    session = Session(tmp_path, failed_reference(tmp_path))
    report = DiffRun(session).run_all()  # type: ignore[arg-type]
    assert [(r.impl, r.verdict, r.notes, r.runs, r.diagnosis) for r in report.results] == [
        (impl, Verdict.REFERENCE_FAILED, (REFERENCE_FAILED_NOTE,), (), None) for impl in IMPLS]
    assert REFERENCE_FAILED_NOTE == "not run: the eager reference failed"
    assert report.exit_code() == 2  # a usage error: the forward_step's return, not the graphs
    text = render_text(report)
    lines = text.splitlines()
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("-----"))) + 1:]
    rows = [line.split()[:3] for line in table[:table.index("")]]
    assert rows == [["local", "reference-failed", "FAIL"], ["full_iteration", "reference-failed", "FAIL"]]
    assert "\neager reference (error): UsageError: " + WHERE in text
    assert text.count("its dict reports 'lm loss' as float") == 1
    for impl in IMPLS:
        assert f"{impl}: note: not run: the eager reference failed" in text
    assert "none" not in text.split() and "Traceback" not in text and "exit code 2" in text
    saved = json.loads(write_json(report, tmp_path / "report.json").read_text(encoding="utf-8"))
    assert saved["exit_code"] == 2
    assert [(i["impl"], i["verdict"], i["notes"], i["runs"]) for i in saved["impls"]] == [
        (impl, "reference-failed", ["not run: the eager reference failed"], []) for impl in IMPLS]
    assert saved["reference"]["impl"] == "eager" and saved["reference"]["status"] == "error"
    assert [r.impl for r in load_report(tmp_path / "report.json").results] == list(IMPLS)


def test_the_page_names_the_implementations_and_compares_nothing(tmp_path: Path) -> None:
    report = DiffRun(Session(tmp_path, failed_reference(tmp_path))).run_all()  # type: ignore[arg-type]
    page = render_payload(report.to_dict())
    assert 'data-impl="local"' in page and 'data-impl="full_iteration"' in page
    assert 'data-impl="eager"' not in page and 'data-impl="none"' not in page
    assert "The eager reference failed (error)" in page
    assert page.count("Not compared: the eager reference failed.") == 2
    assert "Every compared tensor is equal to eager" not in page


def test_a_crashed_reference_keeps_the_names_and_fails_with_exit_1(tmp_path: Path) -> None:
    crashed = RunRecord(impl=EAGER, dropout=0.0, status="crashed",
                        diagnosis=Diagnosis(error_type="crashed", message="child killed by SIGKILL without a result"))
    report = DiffRun(Session(tmp_path, crashed)).run_all()  # type: ignore[arg-type]
    assert [(r.impl, r.verdict) for r in report.results] == [(impl, Verdict.REFERENCE_FAILED) for impl in IMPLS]
    assert report.exit_code() == 1
    assert "eager reference (crashed): crashed: child killed by SIGKILL" in render_text(report)
