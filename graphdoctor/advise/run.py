"""`advise`: find the fastest graph configuration that is still correct, and bisect a divergence.

The Python API behind `graphdoctor advise`: `advise(config) -> AdviseReport`. Eager runs once; every
candidate (graphdoctor.advise.candidates) that Megatron's validation, the rule catalogue and the
installation allow runs as a graphed child of one shared session (graphdoctor.advise.session), at
the same time where the job plan allows, and is judged by diff's own verdict tree. A candidate that
differs numerically is narrowed scope by scope, then layer by layer (graphdoctor.advise.bisect).
Results are ranked and the fastest passing one is recommended (graphdoctor.advise.rank).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphdoctor.advise.bisect import Bisection, bisect, bisect_start
from graphdoctor.advise.candidates import Candidate, Screening, candidates_for, is_moe, screen
from graphdoctor.advise.rank import (
    NOT_RUN,
    RAN,
    REJECTED,
    UNAVAILABLE,
    CandidateResult,
    Recommendation,
    exit_code,
    recommend,
)
from graphdoctor.advise.session import AdviseSession, CandidateRuns, CandidateView, SharedEager, is_not_run
from graphdoctor.config import DiffConfig
from graphdoctor.errors import UsageError, stopped_exit_code
from graphdoctor.parent.children import ChildRequest, never_started, work_directory
from graphdoctor.parent.gpus import plan_jobs
from graphdoctor.parent.progress import ProgressBoard
from graphdoctor.parent.stopping import partial_report_on_stop
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import EAGER, Role
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.strict_json import nullable

DEFAULT_MAX_CANDIDATES = 32
"""Graphed configurations advise runs at most (candidates and bisection runs together)."""


@dataclass(frozen=True, slots=True)
class Budget:
    """The limits of one advise run and whether they cut it short."""

    max_candidates: int = DEFAULT_MAX_CANDIDATES
    time_budget_s: float | None = None
    exhausted: tuple[str, ...] = ()
    """`time` and/or `max-candidates` when candidates or bisection runs were left out for them."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"max_candidates": self.max_candidates, "time_budget_s": self.time_budget_s,
                "exhausted": list(self.exhausted)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Budget:
        """Inverse of to_dict."""
        return cls(max_candidates=int(data.get("max_candidates", DEFAULT_MAX_CANDIDATES)),
                   time_budget_s=nullable(float, data.get("time_budget_s")),
                   exhausted=tuple(data.get("exhausted", ())))


@dataclass(frozen=True, slots=True)
class AdviseReport:
    """Result of one `advise`: every candidate, the bisections, the recommendation."""

    config: DiffConfig
    results: tuple[CandidateResult, ...]
    recommendation: Recommendation
    reference: RunRecord | None = None
    bisections: tuple[Bisection, ...] = ()
    budget: Budget = field(default_factory=Budget)
    notes: tuple[str, ...] = ()
    wall_s: float = 0.0
    child_wall_s: float = 0.0
    jobs: str = ""
    stopped: str | None = None
    """The signal that stopped graphdoctor before advise finished (`SIGTERM`, ...): a partial report, with
    no recommendation."""

    @property
    def candidates(self) -> tuple[CandidateResult, ...]:
        """The candidates (bisection runs left out), in the order they were listed."""
        return tuple(r for r in self.results if not r.bisection)

    @property
    def not_run(self) -> tuple[CandidateResult, ...]:
        """Candidates and bisection runs the budget left out."""
        return tuple(r for r in self.results if r.status == NOT_RUN)

    def result_of(self, candidate: Candidate) -> CandidateResult | None:
        """The result of one candidate (or bisection run), by key."""
        return next((r for r in self.results if r.candidate.key == candidate.key), None)

    def exit_code(self) -> int:
        """0 when a candidate passed (recommended, or none measurably faster), 1 when none did; 128 + the
        signal's number when a signal stopped advise (as the process exits)."""
        if self.stopped is not None:
            return stopped_exit_code(self.stopped)
        return exit_code(list(self.results), self.config.strict_rng)

    def to_dict(self) -> dict[str, Any]:
        """The `advise` JSON payload (docs/advise.md; wrapped by graphdoctor.envelope)."""
        env = self.reference.env if self.reference is not None else None
        return {"config": self.config.to_dict(), "env": env.to_dict() if env else {},
                "exit_code": self.exit_code(), "wall_s": self.wall_s, "child_wall_s": self.child_wall_s,
                "jobs": self.jobs, "stopped": self.stopped, "budget": self.budget.to_dict(),
                "recommendation": self.recommendation.to_dict(),
                "candidates": [r.to_dict() for r in self.results],
                "not_run": [r.candidate.key for r in self.not_run],
                "bisections": [b.to_dict() for b in self.bisections], "notes": list(self.notes),
                "reference": self.reference.to_dict() if self.reference is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdviseReport:
        """Inverse of to_dict (a payload read back through graphdoctor.envelope.open_envelope)."""
        ref = data.get("reference")
        return cls(config=DiffConfig.from_dict(data["config"]),
                   results=tuple(CandidateResult.from_dict(r) for r in data.get("candidates", ())),
                   recommendation=Recommendation.from_dict(data["recommendation"]),
                   reference=RunRecord.from_dict(ref) if ref else None,
                   bisections=tuple(Bisection.from_dict(b) for b in data.get("bisections", ())),
                   budget=Budget.from_dict(data.get("budget") or {}), notes=tuple(data.get("notes", ())),
                   wall_s=float(data.get("wall_s", 0.0)), child_wall_s=float(data.get("child_wall_s", 0.0)),
                   jobs=str(data.get("jobs", "")), stopped=str(data["stopped"]) if data.get("stopped") else None)


def screened_results(screenings: list[Screening], max_candidates: int) -> tuple[list[Screening], list[CandidateResult]]:
    """(the screenings to run, the results of those that do not run: rejected, unavailable, or over
    --max-candidates), in listing order."""
    to_run: list[Screening] = []
    others: list[CandidateResult] = []
    for s in screenings:
        if s.rejections:
            others.append(CandidateResult(s.candidate, REJECTED, rejections=s.rejections, warnings=s.warnings))
        elif s.unavailable is not None:
            others.append(CandidateResult(s.candidate, UNAVAILABLE, reason=s.unavailable))
        elif len(to_run) >= max_candidates:
            others.append(CandidateResult(s.candidate, NOT_RUN, reason=f"not run: --max-candidates {max_candidates}"))
        else:
            to_run.append(s)
    return to_run, others


class AdviseRun:
    """One advise run's decision flow: eager and the candidates at once, diff's judgement per
    candidate, then the bisections, then the ranking."""

    def __init__(self, session: AdviseSession, screenings: list[Screening], *, max_candidates: int,
                 facts: EnvironmentFacts, env: Mapping[str, str] | None) -> None:
        self.session = session
        self.config = session.config
        self.screenings = screenings
        self.max_candidates = max_candidates
        self.facts, self.env = facts, env
        self.shared = SharedEager()
        self.results: dict[str, CandidateResult] = {}
        self.runs_left = max_candidates
        self.reference: RunRecord | None = None
        self.first: list[ChildRequest] = []
        """The first children: eager (and its control), then every candidate's graphed run (stopped_report)."""

    def run(self) -> AdviseReport:
        """Everything, as an AdviseReport (wall_s filled in by advise())."""
        to_run, others = screened_results(self.screenings, self.max_candidates)
        self.runs_left -= len(to_run)
        self.run_candidates(to_run)
        for result in others:
            self.results[result.candidate.key] = result
        ordered = [self.results[s.candidate.key] for s in self.screenings]
        bisections = self.bisect_all(ordered)
        results = ordered + [r for r in self.results.values() if r.bisection]
        exhausted = tuple(sorted({"time" if "time budget" in r.reason else "max-candidates"
                                  for r in results if r.status == NOT_RUN}))
        return AdviseReport(config=self.config, results=tuple(results),
                            recommendation=recommend(results, self.config), reference=self.reference,
                            bisections=tuple(bisections),
                            budget=Budget(self.max_candidates, self.session.budget_s, exhausted),
                            child_wall_s=self.session.child_wall_s, jobs=self.session.plan.reason)

    def run_candidates(self, to_run: list[Screening]) -> None:
        """Eager (and, with dropout on, the dropout-free control reference every control pair shares)
        and every candidate's graphed child at once, as the plan allows; then diff's judgement of the
        candidates, as many at a time as the plan runs children."""
        cfg = self.config
        taps = cfg.localize is True
        runs = {s.candidate.key: self.candidate_run(s.candidate, cfg) for s in to_run}
        eager = [ChildRequest(EAGER, cfg.dropout, Role.REFERENCE, self.session.workdir, taps=taps)]
        if cfg.dropout > 0 and to_run:
            eager.append(ChildRequest(EAGER, 0.0, Role.REFERENCE, self.session.workdir))
        graphed = [runs[s.candidate.key].view.tag(runs[s.candidate.key].request(
            s.candidate.impl, cfg.dropout, Role.GRAPHED, taps=taps)) for s in to_run]
        self.first = [*eager, *graphed]
        first = self.session.run_many(self.first)
        self.reference = first[0]
        if len(eager) > 1 and not is_not_run(first[1]):
            self.shared.control_reference = first[1]

        def judge(item: tuple[Screening, RunRecord]) -> tuple[str, CandidateResult]:
            screening, record = item
            run = runs[screening.candidate.key]
            try:
                return screening.candidate.key, self.judged(screening, run, record)
            finally:
                run.close()

        workers = max(1, min(self.session.plan.jobs, len(to_run)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for key, result in pool.map(judge, zip(to_run, first[len(eager):], strict=True)):
                self.results[key] = result

    def judged(self, screening: Screening, run: CandidateRuns, graphed: RunRecord) -> CandidateResult:
        """diff's row for one candidate's graphed run (or not-run when the budget left it out)."""
        assert self.reference is not None
        if is_not_run(graphed) or is_not_run(self.reference):
            why = (graphed.diagnosis or self.reference.diagnosis)
            return CandidateResult(screening.candidate, NOT_RUN, reason=why.message if why else "not run")
        result = run.tree().judge_impl(screening.candidate.impl, self.reference, graphed)
        cut = next((r for r in result.runs if is_not_run(r)), None)
        if cut is not None and cut.diagnosis is not None:
            # its control pair never ran: RNG and numerics are not told apart, so no verdict stands
            return CandidateResult(screening.candidate, NOT_RUN, result=result, warnings=screening.warnings,
                                   reason=f"{cut.diagnosis.message} before its control pair")
        return CandidateResult(screening.candidate, RAN, result=result, warnings=screening.warnings)

    def stopped_report(self, signal_name: str) -> AdviseReport:
        """The partial report of an advise stopped by `signal_name`: every candidate judged before the stop
        as judged, every other one not run (with the steps its graphed child finished, where it started),
        the eager reference as the stop left it, and no recommendation."""
        records = self.session.stopped_records(self.first, signal_name)
        reference = self.reference or (records.get(self.first[0]) if self.first else None) \
            or never_started(EAGER, self.config.dropout, signal_name)
        graphed = {getattr(r, "key", ""): records.get(r) for r in self.first if r.impl != EAGER}
        _, others = screened_results(self.screenings, self.max_candidates)
        screened = {r.candidate.key: r for r in others}
        results = []
        for s in self.screenings:
            key = s.candidate.key
            known = self.results.get(key) or screened.get(key)
            if known is None:
                record = graphed.get(key)
                where = "" if record is None else f" ({record.status} after {len(record.steps)} steps)"
                known = CandidateResult(s.candidate, NOT_RUN, reason=f"not run: stopped by {signal_name}{where}",
                                        warnings=s.warnings)
            results.append(known)
        results += [r for r in self.results.values() if r.bisection]
        done = sum(r.status == RAN for r in results if not r.bisection)
        runnable = sum(r.status in (RAN, NOT_RUN) for r in results if not r.bisection)
        why = f"stopped by {signal_name} after {done} of {runnable} runnable candidates were judged: no recommendation"
        return AdviseReport(config=self.config, results=tuple(results), recommendation=Recommendation(None, reason=why),
                            reference=reference, budget=Budget(self.max_candidates, self.session.budget_s),
                            child_wall_s=self.session.child_wall_s, jobs=self.session.plan.reason,
                            stopped=signal_name)

    def candidate_run(self, candidate: Candidate, config: DiffConfig) -> CandidateRuns:
        """The runs of one candidate on the shared session, for diff's verdict tree."""
        return CandidateRuns(CandidateView(self.session, candidate, candidate.config(config)), self.shared)

    def bisect_all(self, ordered: list[CandidateResult]) -> list[Bisection]:
        """Bisect, per implementation, the widest candidate that differs numerically."""
        if self.reference is None or self.reference.status != "ok":
            return []
        starts = bisect_start([(r.candidate, r.differs()) for r in ordered])
        return [bisect(start, self.config.num_layers, self.probe, moe=is_moe(self.config)) for start in starts]

    def probe(self, candidate: Candidate) -> bool | None:
        """The bisection's judge: a known result, else one graphed run at dropout 0 (numerics only)."""
        known = self.results.get(candidate.key)
        if known is not None:
            return known.differs()
        screening = screen(candidate, self.config, facts=self.facts, env=self.env)
        if not screening.runnable:
            status = REJECTED if screening.rejections else UNAVAILABLE
            self.results[candidate.key] = CandidateResult(candidate, status, rejections=screening.rejections,
                                                          reason=screening.unavailable or "", bisection=True)
            return None
        if self.runs_left <= 0 or self.session.out_of_time():
            why = (f"not run: --max-candidates {self.max_candidates}" if self.runs_left <= 0 else
                   f"not run: the time budget ({self.session.budget_s or 0:.0f} s) ran out")
            self.results[candidate.key] = CandidateResult(candidate, NOT_RUN, reason=why, bisection=True)
            return None
        self.runs_left -= 1
        self.results[candidate.key] = self.probe_run(candidate)
        return self.results[candidate.key].differs()

    def probe_run(self, candidate: Candidate) -> CandidateResult:
        """One bisection run: graphed at dropout 0 against the dropout-0 eager reference."""
        assert self.reference is not None
        config = self.config.replace(dropout=0.0, memory=False, launches=False, localize=False)
        reference = self.reference if self.config.dropout == 0.0 else self.control_reference()
        run = self.candidate_run(candidate, config)
        try:
            graphed = run.view.run_request(run.request(candidate.impl, 0.0, Role.GRAPHED))
            if is_not_run(graphed) or reference is None:
                why = graphed.diagnosis.message if graphed.diagnosis else "not run: no eager reference at dropout 0"
                return CandidateResult(candidate, NOT_RUN, reason=why, bisection=True)
            return CandidateResult(candidate, RAN, result=run.tree().judge(reference, graphed), bisection=True)
        finally:
            run.close()

    def control_reference(self) -> RunRecord | None:
        """The eager run at dropout 0 (the control pairs' reference, or one made now)."""
        if self.shared.control_reference is None:
            record = self.session.run_request(ChildRequest(EAGER, 0.0, Role.REFERENCE, self.session.workdir))
            if record.status == "ok":
                self.shared.control_reference = record
        return self.shared.control_reference


def advise(config: DiffConfig, *, max_candidates: int = DEFAULT_MAX_CANDIDATES, time_budget_s: float | None = None,
           workdir: str | Path | None = None, progress: ProgressBoard | None = None,
           facts: EnvironmentFacts | None = None) -> AdviseReport:
    """Run eager once and every candidate graph configuration; rank them; bisect divergences.

    Args:
        config: the model and run (config.impls: the implementations to consider; its
            cuda_graph_modules are not used: advise picks the scopes; localize None is taken as
            False: the bisection localizes, and localize True taps every run from the start).
        max_candidates: graphed configurations to run at most (candidates, then bisection runs).
        time_budget_s: no child starts after this many seconds; what did not run is listed.
        workdir: where children write specs, events and logs (default: a temporary directory).
        progress: the progress board (one line per running child).
        facts: the training machine for the rule catalogue (default: this machine, detected).

    Raises:
        NoGPUError: no CUDA GPU is visible.
        UsageError: max_candidates < 1 or time_budget_s <= 0.
        MissingDependencyError: the TE layer spec without an importable Transformer Engine; a setting this
            machine's installation cannot build (GD308, GD309: parent.static.refuse_what_cannot_build).
        Stopped: a stop signal (graphdoctor.parent.stopping); its `report` is the partial AdviseReport
            (AdviseRun.stopped_report).
    """
    if max_candidates < 1:
        raise UsageError(f"max_candidates: got {max_candidates}, expected >= 1")
    if time_budget_s is not None and time_budget_s <= 0:
        raise UsageError(f"time_budget_s: got {time_budget_s}, expected > 0")
    from graphdoctor.parent.static import refuse_before_gpu_work

    refuse_before_gpu_work(config, "graphdoctor advise")
    started = time.perf_counter()
    if config.localize is None:
        # advise localizes by bisection; the tapped pair diff adds after a divergence is not run
        config = config.replace(localize=False)
    facts, env = _machine(facts, config)
    screenings = [screen(c, config, facts=facts, env=env) for c in candidates_for(config)]
    deadline = time.monotonic() + time_budget_s if time_budget_s is not None else None
    with work_directory(workdir, "graphdoctor-advise-") as base:
        plan = plan_jobs(config)
        session = AdviseSession(config, base, progress, plan, deadline=deadline)
        session.budget_s = time_budget_s
        session.note(plan.reason)
        run = AdviseRun(session, screenings, max_candidates=max_candidates, facts=facts, env=env)
        # stopped: the children are ended already; the partial report says how far advise got
        try:
            with partial_report_on_stop(lambda signal_name: dataclasses.replace(
                    run.stopped_report(signal_name), wall_s=time.perf_counter() - started)):
                report = run.run()
        finally:
            session.close()
    notes = ("--cuda-graph-modules is not used: advise tries the scopes itself",) if config.cuda_graph_modules else ()
    return dataclasses.replace(report, wall_s=time.perf_counter() - started, notes=(*report.notes, *notes))


def plan(config: DiffConfig, *, facts: EnvironmentFacts | None = None) -> list[Screening]:
    """The candidates advise would run for `config`, each screened without a GPU (Transformer Engine
    availability, Megatron's TransformerConfig validation, the rule catalogue): what `advise --plan`
    prints, on any machine."""
    facts, env = _machine(facts, config)
    return [screen(c, config, facts=facts, env=env) for c in candidates_for(config)]


def diff_plan(config: DiffConfig, *, facts: EnvironmentFacts | None = None) -> list[Screening]:
    """The rows `graphdoctor diff` would run for `config` (each implementation with the run's cuda_graph_modules
    and graph_layers), screened as advise screens its candidates: what `diff --plan` prints, on any machine."""
    from graphdoctor.advise.candidates import Candidate

    facts, env = _machine(facts, config)
    return [screen(Candidate(impl, () if impl == "full_iteration" else config.cuda_graph_modules, config.graph_layers),
                   config, facts=facts, env=env) for impl in config.impls]


def _machine(facts: EnvironmentFacts | None, config: DiffConfig) -> tuple[EnvironmentFacts, dict[str, str]]:
    """This machine's facts and the environment its children get (what the environment rules read)."""
    from graphdoctor.rules.facts import detect_facts
    from graphdoctor.rules.target import relevant_env

    return (facts if facts is not None else detect_facts()), {**relevant_env(os.environ), **config.env}


__all__ = ["DEFAULT_MAX_CANDIDATES", "AdviseReport", "AdviseRun", "Budget", "advise", "diff_plan", "plan",
           "screened_results"]
