"""The diff report: its schema (`DiffReport`, versioned JSON in docs/diff.md, written by `to_dict`) and the one
loader of saved reports (`from_dict`, `load_report`; `load_saved` also reads a recorded tap table, `TapRecording`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphdoctor.compare.divergence import Divergence
from graphdoctor.compare.forensics import Forensics
from graphdoctor.compare.verdict import ImplResult
from graphdoctor.config import DiffConfig
from graphdoctor.errors import InputFileError, stopped_exit_code
from graphdoctor.inputs import read_json
from graphdoctor.parent.timeline import Timeline, observer_costs, unique_runs
from graphdoctor.protocol.events import RunEnv
from graphdoctor.protocol.record import RunRecord
from graphdoctor.strict_json import nullable
from graphdoctor.types import Diagnosis, Verdict

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
            ValueError: a schema this version cannot read, or another command's document.
        """
        version = data.get("schema_version")
        if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
            raise ValueError(f"schema_version {version} is newer than this graphdoctor reads "
                             f"(expected 1 or {SCHEMA_VERSION})")
        if version not in (1, SCHEMA_VERSION):
            raise ValueError(f"schema_version: got {version!r}, expected 1 or {SCHEMA_VERSION}")
        command = data.get("command")
        if command is not None and command != "diff":
            raise ValueError(f"command: got {command!r}, expected 'diff'")
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


_KWARG = re.compile(r"(\w+)=('[^']*'|\([^)]*\)|[\w.]+)")
"""One `name=value` of a recorded `diff(DiffConfig(...))` command line."""

_INT_SETTINGS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "steps", "cuda_graph_warmup_steps")


@dataclass(frozen=True, slots=True)
class TapRecording:
    """A recorded tap-table file (fixtures/data/forensics/*.json.gz): how one implementation was diffed with taps,
    and what the live analysis found. Its `reference` and `graphed` tap tables are not read here."""

    recorded: str
    """The machine, versions and date of the recording (one line)."""
    command: str
    """The recorded `diff(DiffConfig(...))` call."""
    dropout: float | None
    result: ImplResult
    """The implementation's verdict, first divergence, diagnosis, notes and forensics (no runs)."""

    def settings(self) -> dict[str, Any]:
        """The command's `name=value` settings (quotes stripped; the sizes and step counts as ints)."""
        values: dict[str, Any] = {key: value.strip("'") for key, value in _KWARG.findall(self.command)}
        for key in _INT_SETTINGS:
            if key in values and str(values[key]).isdigit():
                values[key] = int(values[key])
        return values

    @staticmethod
    def recognises(data: Mapping[str, Any]) -> bool:
        """True for a tap recording's top level (tap tables and no `impls`)."""
        return "impls" not in data and "graphed" in data and "reference" in data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TapRecording:
        """The recording's `live_*` fields as typed records."""
        def opt(key: str, load: Any) -> Any:
            value = data.get(key)
            return load(value) if value else None

        result = ImplResult(impl=str(data["impl"]), verdict=Verdict(data["live_verdict"]),
                            divergence=opt("live_first_divergence", Divergence.from_dict),
                            diagnosis=opt("live_diagnosis", Diagnosis.from_dict),
                            notes=tuple(str(n) for n in data.get("live_notes") or ()),
                            forensics=opt("live_analysis", Forensics.from_dict))
        return cls(recorded=str(data.get("recorded") or ""), command=str(data.get("command") or ""),
                   dropout=nullable(float, data.get("dropout")), result=result)


def read_saved(data: Any, where: str = "") -> DiffReport | TapRecording:
    """A saved diff report (schema 1 or 2, or `DiffReport.to_dict()`) or tap recording as its typed record.

    Raises:
        InputFileError: not a diff report or tap recording (`where`, the file, prefixes the message).
    """
    if isinstance(data, Mapping) and TapRecording.recognises(data):
        return _typed(TapRecording.from_dict, data, where)
    return _typed(DiffReport.from_dict, data, where)


def load_saved(path: str | Path) -> DiffReport | TapRecording:
    """Read a saved diff report or tap recording (.json or .json.gz) through the bounded input layer.

    Raises:
        InputFileError: unreadable, not JSON, too large, or neither a diff report nor a tap recording.
    """
    return read_saved(read_json(path, "diff report"), str(path))


def load_report(path: str | Path) -> DiffReport:
    """Read a saved diff report (schema 1 or 2).

    Raises:
        InputFileError: unreadable, not JSON, or not a diff report.
    """
    return _typed(DiffReport.from_dict, read_json(path, "diff report"), str(path))


def _typed[Saved: (DiffReport, TapRecording)](load: Callable[[dict[str, Any]], Saved], data: Any, where: str) -> Saved:
    """`load(data)`, every way a file that is not a report fails as one InputFileError."""
    prefix = f"{where}: " if where else ""
    if not isinstance(data, Mapping):
        raise InputFileError(f"{prefix}not a graphdoctor diff report (top level is not an object)")
    try:
        return load(dict(data))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputFileError(f"{prefix}not a graphdoctor diff report ({type(exc).__name__}: {exc})") from None


__all__ = ["SCHEMA_VERSION", "DiffReport", "TapRecording", "load_report", "load_saved", "read_saved"]
