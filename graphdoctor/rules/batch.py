"""`check_many()`: one check per input (run files, launch-line files) in one process -> BatchReport.

Megatron-Core is imported once for all inputs; a bad input is reported as that input's error and
the others are still checked. Selection and inline suppression are applied here, so every output
format shows the same findings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphdoctor.errors import GraphDoctorError
from graphdoctor.rules.engine import CheckReport, check
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.rules.finding import Finding, Severity
from graphdoctor.rules.suppression import partition

INLINE_LABEL = "<megatron-args>"
"""Path shown for a launch line given inline (not as @file)."""
NO_INPUT_LABEL = "<no input>"
"""Shown for `check --probe` without a run file or launch line."""


@dataclass(frozen=True, slots=True)
class CheckInput:
    """One thing to check: a run file, a launch line, or both merged (launch line over run file)."""

    run_file: str | None = None
    megatron_args: str | None = None

    @property
    def label(self) -> str:
        """The path findings of this input are reported under."""
        if self.run_file is not None:
            return self.run_file
        if self.megatron_args is None:
            return NO_INPUT_LABEL
        if self.megatron_args.startswith("@"):
            return self.megatron_args[1:]
        return INLINE_LABEL

    @property
    def kind(self) -> str:
        """`run-file`, `launch-line` or `run-file+launch-line`."""
        kinds = [k for k, v in (("run-file", self.run_file), ("launch-line", self.megatron_args)) if v is not None]
        return "+".join(kinds)


@dataclass(frozen=True, slots=True)
class InputResult:
    """The outcome of one input: its report, or the one-line error that stopped it."""

    input: CheckInput
    report: CheckReport | None = None
    error: str | None = None
    num_suppressed: int = 0


@dataclass(frozen=True, slots=True)
class BatchReport:
    """Every input's result plus the facts they were judged against."""

    results: tuple[InputResult, ...]
    facts: EnvironmentFacts = field(default_factory=EnvironmentFacts.unknown_machine)
    notes: tuple[str, ...] = ()

    def findings(self) -> list[tuple[CheckInput, Finding]]:
        """(input, finding) pairs, input order then report order."""
        return [(r.input, f) for r in self.results if r.report is not None for f in r.report.findings]

    @property
    def has_errors(self) -> bool:
        """Any error-level finding."""
        return any(f.severity is Severity.ERROR for _, f in self.findings())

    @property
    def num_input_errors(self) -> int:
        """Inputs that could not be checked (bad input)."""
        return sum(r.error is not None for r in self.results)

    def exit_code(self) -> int:
        """2 when an input could not be checked, else 1 with an error-level finding, else 0."""
        if self.num_input_errors:
            return 2
        return 1 if self.has_errors else 0

    def counts(self) -> dict[str, int]:
        """Findings per severity."""
        findings = [f for _, f in self.findings()]
        return {s.value: sum(f.severity is s for f in findings) for s in Severity}

    def to_payload(self) -> dict[str, Any]:
        """The `check` JSON payload (inside the envelope; docs/json.md)."""
        findings = []
        for check_input, finding in self.findings():
            findings.append({**finding.to_dict(), "input": check_input.label})
        return {
            "exit_code": self.exit_code(),
            "has_errors": self.has_errors,
            "counts": self.counts(),
            "findings": findings,
            "not_checked": [{**f.to_dict(), "input": r.input.label} for r in self.results if r.report is not None
                            for f in r.report.not_checked],
            "notes": [*self.notes, *(f"{r.input.label}: {n}" if len(self.results) > 1 else n
                                     for r in self.results if r.report is not None for n in r.report.notes)],
            "inputs": [{"path": r.input.label, "kind": r.input.kind, "error": r.error,
                        "num_findings": len(r.report.findings) if r.report is not None else 0,
                        "num_suppressed": r.num_suppressed} for r in self.results],
            "target": self.facts.to_dict(),
        }


def check_one(check_input: CheckInput, facts: EnvironmentFacts, select: Iterable[str] | None) -> InputResult:
    """Check one input; a GraphDoctorError becomes the result's error line."""
    try:
        report = check(check_input.run_file, check_input.megatron_args, facts=facts, select=select)
    except GraphDoctorError as exc:
        return InputResult(check_input, error=str(exc))
    return suppress(check_input, report)


def suppress(check_input: CheckInput, report: CheckReport) -> InputResult:
    """Drop the findings an inline comment suppresses; say how many in the result."""
    kept, dropped = partition(report.findings)
    notes = report.notes + ((f"{len(dropped)} finding(s) suppressed by inline comments",) if dropped else ())
    return InputResult(check_input, CheckReport(findings=tuple(kept), notes=notes, not_checked=report.not_checked),
                       num_suppressed=len(dropped))


def check_many(inputs: Sequence[CheckInput], facts: EnvironmentFacts | None = None,
               select: Iterable[str] | None = None) -> BatchReport:
    """Check every input against the same facts and selection.

    Args:
        inputs: run files and/or launch lines.
        facts: the training machine (None: unknown; see graphdoctor.rules.target).
        select: codes to report (None: all).

    Returns:
        The BatchReport (bad inputs carry their error instead of a report).
    """
    facts = facts if facts is not None else EnvironmentFacts.unknown_machine()
    wanted = set(select) if select is not None else None
    return BatchReport(results=tuple(check_one(i, facts, wanted) for i in inputs), facts=facts)


__all__ = ["INLINE_LABEL", "NO_INPUT_LABEL", "BatchReport", "CheckInput", "InputResult", "check_many", "check_one", "suppress"]
