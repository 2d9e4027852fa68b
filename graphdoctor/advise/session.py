"""Running many candidate configurations against one eager reference, through diff's own machinery.

`AdviseSession` is a ChildSession (the one runner: isolated children with timeouts, GPU slots, port
retries, progress) whose requests may carry a candidate: that child then runs the candidate's
DiffConfig (its implementation, cuda_graph_modules and graph_layers) under a name of its own. A
`CandidateView` is one candidate's view of that session, and `CandidateRuns` the runs diff's verdict tree
asks of it, so that the tree judges the candidate exactly as `graphdoctor diff` judges an implementation
(targeted re-runs, control pair, eager noise, culprit hunt) while every child shares the session's GPU slots
and time budget. Eager does not depend on the scope, so the eager reference, the dropout-free control
reference and the eager-noise run are made once and shared by every candidate.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from graphdoctor.advise.candidates import Candidate
from graphdoctor.config import DiffConfig
from graphdoctor.diff.decide import VerdictTree
from graphdoctor.diff.schedule import ChildSchedule
from graphdoctor.parent.children import ChildRequest, ChildSession
from graphdoctor.parent.gpus import JobPlan
from graphdoctor.parent.progress import ProgressBoard
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import ChildSpec, Role
from graphdoctor.types import Diagnosis

BUDGET_ERROR = "budget"
"""Diagnosis.error_type of a child that was not started because the time budget ran out."""


@dataclass(frozen=True, slots=True)
class CandidateRequest(ChildRequest):
    """A child request on behalf of one candidate."""

    key: str = ""
    """Candidate.key (empty: the session's own configuration, e.g. the eager reference)."""
    label: str = ""
    """Candidate.label, shown on the progress board."""

    def describe(self) -> str:
        """`local attn: graphed`."""
        return f"{self.label}: {ChildRequest.describe(self)}" if self.label else ChildRequest.describe(self)


def not_run_record(request: ChildRequest, why: str) -> RunRecord:
    """The record of a child that was never started (status unavailable, diagnosis `budget`)."""
    return RunRecord(impl=request.impl, dropout=request.dropout, status="unavailable",
                     diagnosis=Diagnosis(error_type=BUDGET_ERROR, message=why))


def is_not_run(record: RunRecord) -> bool:
    """True for a not_run_record."""
    return record.diagnosis is not None and record.diagnosis.error_type == BUDGET_ERROR


class AdviseSession(ChildSession):
    """One advise run's children: the shared session, with per-candidate configurations and a deadline."""

    def __init__(self, config: DiffConfig, workdir: Path, board: ProgressBoard | None = None,
                 plan: JobPlan | None = None, *, deadline: float | None = None) -> None:
        super().__init__(config, workdir, board, plan)
        self.configs: dict[str, DiffConfig] = {}
        self.deadline = deadline
        """time.monotonic() after which no child starts (None: no time budget)."""
        self.budget_s: float | None = None

    def out_of_time(self) -> bool:
        """True once the deadline has passed."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def spec(self, request: ChildRequest, *, attempt: int = 0, gpu_turn: str | None = None,
             resumed: bool = False) -> ChildSpec:
        """ChildSession's spec, with the candidate's configuration and a name prefixed by its key."""
        spec = ChildSession.spec(self, request, attempt=attempt, gpu_turn=gpu_turn, resumed=resumed)
        key = request.key if isinstance(request, CandidateRequest) else ""
        if not key:
            return spec
        config = self.configs[key]
        if request.role is Role.TAPPED or request.targeted:
            config = config.replace(memory=False, launches=False)
        name = f"{key}-{spec.name}"
        return dataclasses.replace(spec, config=config, name=name,
                                   events_path=str(self.workdir / f"events-{name}.jsonl"))

    def run_request(self, request: ChildRequest, cancel: threading.Event | None = None) -> RunRecord:
        """Run one child, unless the time budget has run out (then a not-run record)."""
        if self.out_of_time():
            return not_run_record(request, f"not run: the time budget ({self.budget_s or 0:.0f} s) ran out")
        return ChildSession.run_request(self, request, cancel)


class CandidateView(ChildSession):
    """One candidate's view of the AdviseSession: its configuration, the shared runner."""

    def __init__(self, shared: AdviseSession, candidate: Candidate, config: DiffConfig) -> None:
        super().__init__(config, shared.workdir, shared.board, shared.plan)
        self.shared = shared
        self.candidate = candidate
        shared.configs[candidate.key] = config

    def tag(self, request: ChildRequest) -> CandidateRequest:
        """The request on behalf of this candidate (eager requests stay the session's own)."""
        fields = {f.name: getattr(request, f.name) for f in dataclasses.fields(ChildRequest)}
        if request.impl == "eager":
            return CandidateRequest(**fields)
        return CandidateRequest(**fields, key=self.candidate.key, label=self.candidate.label)

    def run_request(self, request: ChildRequest, cancel: threading.Event | None = None) -> RunRecord:
        """Run on the shared session."""
        return self.shared.run_request(self.tag(request), cancel)

    def submit(self, request: ChildRequest) -> Future[RunRecord]:
        """Submit to the shared session (its GPU slots and worker threads)."""
        return self.shared.submit(self.tag(request))

    def cancel(self, futures: list[Future[RunRecord]], *, wait: bool = True) -> None:
        """Cancel on the shared session."""
        self.shared.cancel(futures, wait=wait)

    def close(self) -> None:
        """The shared session's workers outlive one candidate (AdviseSession.close ends them)."""

    def run_many(self, requests: list[ChildRequest]) -> list[RunRecord]:
        """Run several on the shared session (at once where its plan allows)."""
        return self.shared.run_many([self.tag(r) for r in requests])


class SharedEager:
    """The eager runs every candidate shares: the control reference and the eager-noise run."""

    def __init__(self) -> None:
        self.control_reference: RunRecord | None = None
        self.noise: dict[float, RunRecord] = {}
        """The eager-noise run per dropout, once made."""
        self.lock = threading.Lock()
        """Held while the eager-noise run is made (candidates are judged several at a time)."""


class CandidateRuns(ChildSchedule):
    """diff's runs (graphdoctor.diff.decide.Runs) for one candidate: a ChildSchedule over its view, whose eager
    control reference and eager-noise run are shared with the other candidates."""

    def __init__(self, view: CandidateView, shared: SharedEager) -> None:
        super().__init__(view)
        self.view = view
        self.shared = shared

    def tree(self) -> VerdictTree:
        """diff's verdict tree for this candidate, over these runs."""
        return VerdictTree(self.view.config, self)

    def control_reference(self) -> RunRecord:
        """The control reference another candidate made, if any; the one made here serves the next candidates."""
        if self.shared.control_reference is not None:
            return self.shared.control_reference
        made = super().control_reference()
        if self.shared.control_reference is None:
            self.shared.control_reference = made
        return made

    def eager_again(self, dropout: float) -> RunRecord:
        """The eager-noise run, made once per advise run (per dropout) and reused afterwards."""
        with self.shared.lock:
            if dropout not in self.shared.noise:
                self.shared.noise[dropout] = super().eager_again(dropout)
            return self.shared.noise[dropout]

    def close(self) -> None:
        """Remove this candidate's scratch directory (the shared session and its workers outlive it)."""
        shutil.rmtree(self.ref_dir, ignore_errors=True)


__all__ = ["BUDGET_ERROR", "AdviseSession", "CandidateRequest", "CandidateRuns", "CandidateView", "SharedEager",
           "is_not_run", "not_run_record"]
