"""The diff report: its schema (`DiffReport`, versioned JSON in docs/diff.md, written by `to_dict`) and its one
loader (`from_dict`, `load_report`), which reads schema 1 and 2 reports."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphdoctor.compare.verdict import ImplResult
from graphdoctor.config import DiffConfig
from graphdoctor.errors import InputFileError, stopped_exit_code
from graphdoctor.inputs import read_json
from graphdoctor.parent.timeline import Timeline, observer_costs, unique_runs
from graphdoctor.protocol.events import RunEnv
from graphdoctor.protocol.record import RunRecord
from graphdoctor.types import Verdict

SCHEMA_VERSION = 2
"""Version of the JSON report (docs/diff.md). 2: the eager implementation is `eager` (was `none`),
runs carry `name` and their end-of-run memory figures at the top level; schema 1 reports still load."""


@dataclass(frozen=True, slots=True)
class DiffReport:
    """Result of one `diff`: one ImplResult per implementation, plus the eager reference."""

    config: DiffConfig
    results: tuple[ImplResult, ...]
    reference: RunRecord
    control_reference: RunRecord | None = None
    wall_s: float = 0.0
    """Wall time of the whole diff."""
    child_wall_s: float = 0.0
    """Sum of the children's wall times."""
    scratch_bytes: int = 0
    """Most bytes the diff held on disk for reference tensors at once (targeted re-runs only)."""
    jobs: str = ""
    """How the children were scheduled (one line)."""
    stopped: str | None = None
    """The signal that stopped graphdoctor before the diff finished (`SIGTERM`, ...): a partial report."""
    model: dict[str, Any] | None = None
    """The model as built (graphdoctor.config.description.model_facts); None in reports written before it."""
    timeline: Timeline | None = None
    """When the command started and finished, and its first and last child; None in older reports."""

    def runs(self) -> list[RunRecord]:
        """Every child of the diff once: the reference, the control reference, each row's runs."""
        return unique_runs([self.reference, self.control_reference, *(r for res in self.results for r in res.runs)])

    @property
    def env(self) -> RunEnv | None:
        """Versions and device, as the eager reference reported them."""
        return self.reference.env

    def exit_code(self) -> int:
        """0: all passed (rng-divergence unless strict_rng or a cause explains it) and every process exited within
        its bound; 2: the reference hit a usage error, or the machine failed a run (environment-failed) and no
        other row failed; else 1 (a teardown-hang is a finding even when the results match); 128 + the signal's
        number when a signal stopped the diff (as the process exits)."""
        if self.stopped is not None:
            return stopped_exit_code(self.stopped)
        if self.reference.status == "error" and getattr(self.reference.diagnosis, "error_type", "") == "UsageError":
            return 2
        if any(e.hung for run in (self.reference, *(r for res in self.results for r in res.runs))
               for e in run.teardown):
            return 1
        environment = False
        for result in self.results:
            if result.verdict == Verdict.UNAVAILABLE:
                continue
            if result.verdict == Verdict.ENVIRONMENT_FAILED:
                environment = True
                continue
            if not result.passed:
                return 1
            if result.verdict == Verdict.RNG_DIVERGENCE and self.config.strict_rng:
                return 1
        return 2 if environment else 0

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON report (schema in docs/diff.md)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "graphdoctor diff",
            "config": self.config.to_dict(),
            "env": self.env.to_dict() if self.env else {},
            "exit_code": self.exit_code(),
            "wall_s": self.wall_s,
            "child_wall_s": self.child_wall_s,
            "scratch_bytes": self.scratch_bytes,
            "jobs": self.jobs,
            "reference": self.reference.to_dict(),
            "control_reference": self.control_reference.to_dict() if self.control_reference else None,
            "impls": [r.to_dict() for r in self.results],
            "stopped": self.stopped,
            "model": self.model,
            "timeline": self.timeline.to_dict() if self.timeline else None,
            "observers": [c.to_dict() for c in observer_costs(self.runs())],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiffReport:
        """A saved report (schema 1 or 2) as a DiffReport.

        Raises:
            ValueError: a schema this version cannot read.
        """
        version = data.get("schema_version")
        if version not in (1, SCHEMA_VERSION):
            raise ValueError(f"schema_version: got {version!r}, expected 1 or {SCHEMA_VERSION}")
        control = data.get("control_reference")
        return cls(config=DiffConfig.from_dict(data["config"]),
                   results=tuple(ImplResult.from_dict(r) for r in data.get("impls", ())),
                   reference=RunRecord.from_dict(data["reference"]),
                   control_reference=RunRecord.from_dict(control) if control else None,
                   wall_s=float(data.get("wall_s", 0.0)), child_wall_s=float(data.get("child_wall_s", 0.0)),
                   scratch_bytes=int(data.get("scratch_bytes", 0)), jobs=str(data.get("jobs", "")),
                   stopped=str(data["stopped"]) if data.get("stopped") else None,
                   model=data["model"] if isinstance(data.get("model"), dict) else None,
                   timeline=Timeline.from_dict(data["timeline"]) if isinstance(data.get("timeline"), dict) else None)


def load_report(path: str | Path) -> DiffReport:
    """Read a saved diff report (schema 1 or 2).

    Raises:
        InputFileError: unreadable, not JSON, or not a diff report.
    """
    data = read_json(path, "diff report")
    try:
        return DiffReport.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputFileError(f"{path}: not a graphdoctor diff report ({type(exc).__name__}: {exc})") from None


__all__ = ["SCHEMA_VERSION", "DiffReport", "load_report"]
