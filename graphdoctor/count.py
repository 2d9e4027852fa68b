"""`count`: a quick launch-accounting run without the numeric diff (the API behind live
`graphdoctor count`).

Runs eager and each graphed implementation in isolated children (as `diff` does) with only the
launch observer: the profiled step's host launches, GPU kernels eager and inside graphs, RNG
prologue fills, coverage and the graph census. No tensors are saved or compared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphdoctor.config import DiffConfig
from graphdoctor.errors import stopped_exit_code
from graphdoctor.launches.compare import LaunchComparison, compare_launches
from graphdoctor.parent.availability import why_unavailable
from graphdoctor.parent.children import ChildRequest, ChildSession, never_started, work_directory
from graphdoctor.parent.progress import ProgressBoard
from graphdoctor.parent.static import refuse_before_gpu_work
from graphdoctor.parent.stopping import partial_report_on_stop
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import EAGER, Role

SCHEMA_VERSION = 1
"""Version of the live count JSON (docs/launches.md)."""


@dataclass(frozen=True, slots=True)
class CountReport:
    """Launch figures of eager and every graphed implementation."""

    config: DiffConfig
    eager: RunRecord
    runs: tuple[RunRecord, ...]
    unavailable: dict[str, str]
    wall_s: float = 0.0
    stopped: str | None = None
    """The signal that stopped graphdoctor before every run finished (`SIGTERM`, ...): a partial report."""

    def sections(self) -> list[tuple[str, LaunchComparison]]:
        """(impl, eager and graphed launches side by side) per graphed run that profiled."""
        eager_step = self.eager.launches.step if self.eager.launches is not None else None
        return [(run.impl, compare_launches(eager_step, run.launches)) for run in self.runs
                if run.launches is not None]

    def exit_code(self) -> int:
        """0 when every run finished, else 1 (unavailable implementations are not failures); 128 + the
        signal's number when a signal stopped the count (as the process exits)."""
        if self.stopped is not None:
            return stopped_exit_code(self.stopped)
        return 0 if all(r.status == "ok" for r in (self.eager, *self.runs)) else 1

    def to_dict(self) -> dict[str, Any]:
        """Versioned JSON view."""
        sections = {impl: section.to_dict() for impl, section in self.sections()}
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "graphdoctor count",
            "config": self.config.to_dict(),
            "env": self.eager.env.to_dict() if self.eager.env else {},
            "wall_s": self.wall_s,
            "stopped": self.stopped,
            "eager": {"status": self.eager.status, "steps_done": len(self.eager.steps),
                      "launches": self.eager.launches.to_dict() if self.eager.launches else None,
                      "diagnosis": self.eager.diagnosis.to_dict() if self.eager.diagnosis else None},
            "impls": [{"impl": r.impl, "status": r.status, "steps_done": len(r.steps), "launches": sections.get(r.impl),
                       "diagnosis": r.diagnosis.to_dict() if r.diagnosis else None}
                      for r in self.runs]
                     + [{"impl": impl, "status": "unavailable", "steps_done": 0, "launches": None,
                         "diagnosis": {"message": why}} for impl, why in self.unavailable.items()],
            "exit_code": self.exit_code(),
        }


def count(config: DiffConfig, *, workdir: str | Path | None = None,
          progress: ProgressBoard | None = None) -> CountReport:
    """Profile one steady-state step of eager and of every graphed implementation.

    Args:
        config: the run (model, impls, steps; compare-related fields are ignored).
        workdir: where children write specs, events and logs (default: temporary, removed).
        progress: where to show the running children (None: nowhere).

    Returns:
        The CountReport.

    Raises:
        NoGPUError: no CUDA GPU is visible.
        MissingDependencyError: what diff refuses before any GPU work (parent.static.refuse_before_gpu_work): a
            setting this machine's installation cannot build (GD308, GD309), the TE layer spec without an
            importable Transformer Engine.
        Stopped: a stop signal (graphdoctor.parent.stopping); its `report` is the partial CountReport:
            every run as the stop left it (`stopped`, with the steps it finished and its stacks).
    """
    refuse_before_gpu_work(config, "graphdoctor count (live)")
    started = time.perf_counter()
    config = config.replace(launches=True, memory=False)
    if config.trace_dir:
        Path(config.trace_dir).mkdir(parents=True, exist_ok=True)
    unavailable = {impl: why for impl in config.impls if (why := why_unavailable(impl, config)) is not None}
    impls = (EAGER, *(i for i in config.impls if i not in unavailable))

    def report(records: list[RunRecord], stopped: str | None = None) -> CountReport:
        return CountReport(config=config, eager=records[0], runs=tuple(records[1:]), unavailable=unavailable,
                           wall_s=time.perf_counter() - started, stopped=stopped)

    with work_directory(workdir, "graphdoctor-count-") as base:
        session = ChildSession(config, base, progress)
        requests = [ChildRequest(impl, config.dropout, Role.COUNT, base) for impl in impls]

        def stopped(signal_name: str) -> CountReport:  # the children are ended already: each run as left
            done = session.stopped_records(requests, signal_name)
            return report([done.get(r) or never_started(r.impl, r.dropout, signal_name) for r in requests],
                          signal_name)

        try:
            with partial_report_on_stop(stopped):
                records = [session.run_request(request) for request in requests]
        finally:
            session.close()  # ends the template process its children were forked from
    return report(records)


__all__ = ["SCHEMA_VERSION", "CountReport", "count"]
