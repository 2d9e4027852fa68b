"""AdviseRun's decision flow over real H200 records: eager once and every candidate through diff's verdict tree,
the shared control reference, the time budget and --max-candidates, partial results. The session hands
out the recorded RunRecords of fixtures/data/diff instead of starting children (no torch or Megatron is
replaced); everything else (specs, names, deadlines, judgement, ranking) is the production code."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from graphdoctor.advise import AdviseRun, screened_results
from graphdoctor.advise.candidates import Candidate, Screening, screen
from graphdoctor.advise.rank import NOT_RUN, RAN, REJECTED
from graphdoctor.advise.session import AdviseSession
from graphdoctor.diff import load_report
from graphdoctor.parent.children import ChildRequest
from graphdoctor.parent.gpus import JobPlan
from graphdoctor.protocol import EAGER, RunRecord
from graphdoctor.report.advise import render_text
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.types import Diagnosis, Verdict

DIFF = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"
SERIES = JobPlan(1, (), False, "children run in series")
UNKNOWN = EnvironmentFacts.unknown_machine()


class Recorded(AdviseSession):
    """An AdviseSession whose children are the recorded runs of one H200 diff report."""

    def __init__(self, name: str, workdir: Path, **kwargs: object) -> None:
        self.report = load_report(DIFF / name)
        super().__init__(self.report.config.replace(localize=False), workdir, None, SERIES, **kwargs)  # type: ignore[arg-type]
        self.records = {run.name: run for r in self.report.results for run in r.runs}
        self.started: list[str] = []

    def run_request(self, request: ChildRequest, cancel: threading.Event | None = None) -> RunRecord:
        if self.out_of_time():
            return AdviseSession.run_request(self, request, cancel)
        spec = self.spec(request)
        self.started.append(spec.name)
        if request.impl == EAGER:
            control = self.report.control_reference
            return self.report.reference if request.dropout == self.config.dropout or control is None else control
        key = getattr(request, "key", "")
        recorded = self.records.get(spec.name.removeprefix(f"{key}-"))
        if recorded is None:
            return RunRecord(impl=request.impl, dropout=request.dropout, status="error",
                             diagnosis=Diagnosis(error_type="NotRecorded", message=spec.name, phase="capture"))
        return recorded


def screenings(session: Recorded, candidates: list[Candidate], *, stand_ins: tuple[Candidate, ...] = ()
               ) -> list[Screening]:
    """Each candidate screened as advise screens it; a stand-in is passed unscreened: `local attn`, which
    advise itself does not run (GD219: the same graph as the whole layer), names a second runnable
    candidate whose recorded runs are the whole layer's (only TE scopes differ, and TE is not here)."""
    return [Screening(candidate=c) if c in stand_ins else screen(c, session.config, facts=UNKNOWN)
            for c in candidates]


LOCAL_ATTN = Candidate("local", ("attn",))


def test_eager_and_control_reference_once_then_ranked(tmp_path: Path) -> None:
    session = Recorded("h200_default_dropout0.1_schema2.json", tmp_path)
    # local attn has no run of its own in the report: the recorded whole-layer runs stand in for it,
    # so that two candidates need the dropout-free control pair
    cands = [Candidate("full_iteration"), Candidate("local"), Candidate("local", ("attn",)), Candidate("local", ("moe",))]
    report = AdviseRun(session, screenings(session, cands, stand_ins=(LOCAL_ATTN,)), max_candidates=8, facts=UNKNOWN,
                       env={}).run()
    assert session.started == ["eager-reference-d0.1", "eager-reference-d0",
                               "full_iteration-full_iteration-graphed-d0.1", "local-layer-local-graphed-d0.1",
                               "local-attn-local-graphed-d0.1", "local-layer-local-graphed-d0",
                               "local-attn-local-graphed-d0"]
    by_key = {r.candidate.key: r for r in report.results}
    assert by_key["local-layer"].verdict == Verdict.RNG_DIVERGENCE
    assert by_key["local-attn"].verdict == Verdict.RNG_DIVERGENCE
    assert by_key["full_iteration"].verdict == Verdict.MATCH
    assert by_key["local-moe"].status == REJECTED and by_key["local-moe"].rejections[0].rule == "GD203"
    assert report.recommendation.candidate == Candidate("full_iteration")
    assert report.bisections == () and report.exit_code() == 0
    assert "recommendation: full_iteration whole step" in render_text(report)


def test_time_budget_gone_writes_partial_results_naming_what_did_not_run(tmp_path: Path) -> None:
    session = Recorded("h200_small_dropout0_fingerprints_schema2.json", tmp_path, deadline=time.monotonic() - 1)
    session.budget_s = 5.0
    cands = [Candidate("full_iteration"), Candidate("local")]
    report = AdviseRun(session, screenings(session, cands), max_candidates=8, facts=UNKNOWN, env={}).run()
    assert session.started == []
    assert [r.status for r in report.results] == [NOT_RUN, NOT_RUN]
    assert report.budget.exhausted == ("time",) and report.exit_code() == 1
    text = render_text(report)
    assert "not run (time): full_iteration whole step, local whole layer" in text
    assert "the time budget (5 s) ran out" in text


def test_max_candidates_runs_the_first_and_lists_the_rest(tmp_path: Path) -> None:
    session = Recorded("h200_small_dropout0_fingerprints_schema2.json", tmp_path)
    cands = [Candidate("full_iteration"), Candidate("local"), Candidate("local", ("attn",))]
    screened = screenings(session, cands, stand_ins=(LOCAL_ATTN,))
    to_run, others = screened_results(screened, 2)
    assert [s.candidate for s in to_run] == cands[:2] and [r.status for r in others] == [NOT_RUN]
    report = AdviseRun(session, screened, max_candidates=2, facts=UNKNOWN, env={}).run()
    assert [r.status for r in report.results] == [RAN, RAN, NOT_RUN]
    assert report.budget.exhausted == ("max-candidates",)
    assert report.recommendation.candidate == Candidate("full_iteration") and report.exit_code() == 0
    assert "not run (max-candidates): local attn" in render_text(report)


def test_a_numeric_divergence_is_bisected_with_recorded_runs(tmp_path: Path) -> None:
    """The recorded dropout-0.1 local run whose control pair has no recording here (its child fails, so
    RNG and numerics cannot be told apart): numeric-divergence, and the bisection starts. Its first
    scope probe has no recording either and fails, so the bisection stops with an unknown verdict,
    having asked that one probe, once (the whole layer is never asked again)."""
    session = Recorded("h200_small_clean_dropout_local_fingerprints_schema2.json", tmp_path)
    session.records = {"local-graphed-d0.1": session.records["local-graphed-d0.1-taps"]}
    session.report = session.report.__class__(config=session.report.config, results=session.report.results,
                                               reference=session.report.reference, control_reference=None)
    report = AdviseRun(session, screenings(session, [Candidate("local")]), max_candidates=3, facts=UNKNOWN, env={}).run()
    (local,) = report.candidates
    assert local.verdict == Verdict.NUMERIC_DIVERGENCE
    (bisection,) = report.bisections
    assert bisection.start == Candidate("local") and bisection.stopped == "unknown verdict"
    # local is bisected over layers only (GD219: its attn / mlp scopes are the whole layer)
    assert [s.candidate.label for s in bisection.steps] == ["local whole layer (layer 0)"]
    assert [r.candidate.label for r in report.results if r.bisection] == ["local whole layer (layer 0)"]
    assert session.started.count("local-layer-L0-local-graphed-d0") == 1
    assert "asked: local whole layer (layer 0) unknown (capture-failed); stopped: unknown verdict" in render_text(report)
    assert session.started.count("eager-reference-d0.1") == 1


def test_candidates_judged_two_at_a_time_give_the_same_report(tmp_path: Path) -> None:
    series = Recorded("h200_default_dropout0.1_schema2.json", tmp_path / "a")
    pair = Recorded("h200_default_dropout0.1_schema2.json", tmp_path / "b")
    pair.plan = JobPlan(2, (), False, "2 children at a time")
    cands = [Candidate("full_iteration"), Candidate("local"), Candidate("local", ("attn",))]
    reports = [AdviseRun(s, screenings(s, cands, stand_ins=(LOCAL_ATTN,)), max_candidates=8, facts=UNKNOWN, env={}).run() for s in (series, pair)]
    assert sorted(series.started) == sorted(pair.started) and pair.started.count("eager-reference-d0") == 1
    assert [r.to_dict() for r in reports[0].results] == [r.to_dict() for r in reports[1].results]


class RunsOutAfter(Recorded):
    """The time budget runs out once `limit` children have started."""

    limit = 4

    def run_request(self, request: ChildRequest, cancel: threading.Event | None = None) -> RunRecord:
        if len(self.started) >= self.limit:
            self.deadline = time.monotonic() - 1
        return Recorded.run_request(self, request, cancel)


def test_budget_gone_before_a_control_pair_leaves_no_verdict_standing(tmp_path: Path) -> None:
    session = RunsOutAfter("h200_default_dropout0.1_schema2.json", tmp_path)
    session.budget_s = 60.0
    cands = [Candidate("full_iteration"), Candidate("local")]
    report = AdviseRun(session, screenings(session, cands), max_candidates=8, facts=UNKNOWN, env={}).run()
    full, local = report.candidates
    assert full.status == RAN and full.verdict == Verdict.MATCH
    assert local.status == NOT_RUN and "before its control pair" in local.reason
    assert report.budget.exhausted == ("time",) and report.recommendation.candidate == Candidate("full_iteration")
    assert "not run (time): local whole layer" in render_text(report)


def test_the_eager_noise_run_is_made_once_for_every_numeric_divergence(tmp_path: Path) -> None:
    session = Recorded("h200_small_clean_dropout_local_fingerprints_schema2.json", tmp_path)
    session.records = {"local-graphed-d0.1": session.records["local-graphed-d0.1-taps"]}
    cands = [Candidate("local"), Candidate("local", ("attn",))]  # the same recorded run stands in for both
    report = AdviseRun(session, screenings(session, cands, stand_ins=(LOCAL_ATTN,)), max_candidates=2,
                       facts=UNKNOWN, env={}).run()
    assert [r.verdict for r in report.candidates] == [Verdict.NUMERIC_DIVERGENCE] * 2
    assert session.started.count("eager-graphed-d0") == 1  # against the control reference (dropout on)
    notes = [next(n for n in r.result.notes if "eager" in n and "reproducible" in n)
             for r in report.candidates if r.result is not None]
    assert len(notes) == 2 and notes[0] == notes[1]
