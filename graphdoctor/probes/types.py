"""Plain data the runtime probes pass between stages: Observation, CaptureResult and ProbeReport.

Nothing here imports torch; the worker ships these as JSON between processes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from graphdoctor.rules.finding import Finding, Severity


@dataclass(frozen=True, slots=True)
class Observation:
    """One unsafe operation seen by the recorder during an eager pass of a unit."""

    code: str
    """Rule code the operation violates, e.g. GD501."""

    operator: str
    """What ran: `Tensor.item`, `aten::nonzero`, `torch.cuda.synchronize`, ..."""

    module: str
    """Qualified name of the innermost module that was running, e.g. decoder.layers.0.mlp."""

    location: str
    """`path:line` of the innermost user frame (or of the innermost library frame if none)."""

    user_code: bool
    """True when `location` is user code (not torch, megatron, graphdoctor, stdlib, site-packages)."""

    seq: int
    """Order of the observation within its recording (execution order)."""

    detail: str = ""
    """Extra facts for the message (devices, generator, attribute name, ...)."""

    host_only: bool = False
    """True when every tensor the operation touched was a host (CPU) tensor: it launched no device
    work, so by itself it cannot change what a graph computes."""

    library_issuer: bool = False
    """True when the code that issued the operation (innermost frame outside torch) is library
    code such as Megatron, even when user code further out called it."""

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view for the worker's JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Observation:
        """Inverse of to_dict."""
        return cls(**data)


@dataclass(frozen=True, slots=True)
class CaptureResult:
    """Outcome of one isolated `torch.cuda.graph` capture of a unit."""

    unit: str
    """Qualified module name of the captured unit."""

    ok: bool
    """True when warmup and capture both succeeded."""

    phase: str = "capture"
    """`warmup` or `capture`: where it failed (meaningless when ok)."""

    error_type: str = ""
    """Exception class name of the first error (the root of the exception chain)."""

    error_message: str = ""
    """First line of the first error's message."""

    cuda_error: int | None = None
    """CUDA capture error number (900-908) named by any error in the chain, if any."""

    code: str | None = None
    """Rule code the error text maps to directly (e.g. GD505), if any."""

    location: str | None = None
    """`path:line` of the innermost user frame in the first error's traceback, if any."""

    poisoned: bool = False
    """True when the device failed a health check afterwards (sticky error or dangling capture)."""

    seconds: float = 0.0
    """Wall time of warmup plus capture."""

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view for the worker's JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaptureResult:
        """Inverse of to_dict."""
        return cls(**data)


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """Everything one probe run found: findings plus the per-unit capture outcomes."""

    findings: tuple[Finding, ...]
    """Findings, errors first; each has `extra['module']` and `extra['operator']`."""

    captures: tuple[CaptureResult, ...] = ()
    """One entry per capture attempt, in the order they ran."""

    num_observations: int = 0
    """Unsafe operations the recorder saw before deduplication."""

    tool_errors: tuple[str, ...] = ()
    """Problems of the probe itself (worker crash, timeout, model build failure)."""

    hidden_findings: tuple[Finding, ...] = ()
    """Library-internal findings left out of `findings` (`extra['library_internal']`: a GD507 with no
    user frame on its stack); empty when they were asked for, then they are in `findings`."""

    extra: dict[str, Any] = field(default_factory=dict)
    """Run facts for JSON consumers (spec, torch version, worker runs)."""

    @property
    def num_errors(self) -> int:
        """Findings of severity error."""
        return sum(1 for f in self.findings if f.severity is Severity.ERROR)

    @property
    def exit_code(self) -> int:
        """CLI convention: 2 on a tool error, 1 on any error-level finding, else 0."""
        if self.tool_errors:
            return 2
        return 1 if self.num_errors else 0

    def codes(self) -> list[str]:
        """Rule codes of all findings, in report order."""
        return [f.code for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view for the JSON report."""
        return {
            "findings": [f.to_dict() for f in self.findings],
            "captures": [c.to_dict() for c in self.captures],
            "num_observations": self.num_observations,
            "tool_errors": list(self.tool_errors),
            "hidden_findings": [f.to_dict() for f in self.hidden_findings],
            "extra": dict(self.extra),
        }


__all__ = ["CaptureResult", "Observation", "ProbeReport"]
