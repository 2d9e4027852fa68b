"""Finding, Severity, FixAvailability and Status: the plain data every rule and probe reports.

Shared by the static checks (checks/), the runtime probes and the report renderers; imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    """How bad a finding is; any `error` makes `graphdoctor check` exit 1."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class FixAvailability(StrEnum):
    """Whether the fix is a mechanical change (ruff's Always / Sometimes / None)."""

    ALWAYS = "always"
    SOMETIMES = "sometimes"
    NONE = "none"

    def describe(self) -> str:
        """One sentence for docs and `graphdoctor rule`."""
        return {
            "always": "Fix is always available.",
            "sometimes": "Fix is sometimes available.",
            "none": "Fix is not available.",
        }[self.value]


class Status(StrEnum):
    """Rule maturity: `preview` rules may change their conditions between releases."""

    PREVIEW = "preview"
    STABLE = "stable"


@dataclass(frozen=True, slots=True)
class Finding:
    """One reported problem.

    Static rules fill `fields` (for example `transformer.cuda_graph_impl`, `env.NCCL_GRAPH_REGISTER`,
    `args.check_for_nan_in_loss_and_grad`); runtime probes fill `locations` with `file:line` of the
    offending call. Both render the same way.
    """

    code: str
    """Rule code, e.g. GD101."""

    name: str
    """Rule name, e.g. legacy-flag-with-cuda-graph-impl."""

    severity: Severity
    """error, warning or info."""

    message: str
    """What went wrong and where (one line)."""

    fix: str = ""
    """Imperative fix title; empty when there is none."""

    fields: tuple[str, ...] = ()
    """Configuration keys involved, as `section.key`."""

    locations: tuple[str, ...] = ()
    """Where the keys (or the offending code) are: `path:line` or `--flag`."""

    source: str = "static"
    """`static` (checks) or `probe` (runtime probes)."""

    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Rule-specific data for JSON consumers (never needed to render text)."""

    def __post_init__(self) -> None:
        if not isinstance(self.severity, Severity):
            object.__setattr__(self, "severity", Severity(self.severity))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (the `findings[]` entry of the JSON report, schema_version 1)."""
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "message": self.message,
            "fix": self.fix,
            "fields": list(self.fields),
            "locations": list(self.locations),
            "source": self.source,
            "extra": dict(self.extra),
        }


__all__ = ["Finding", "FixAvailability", "Severity", "Status"]
