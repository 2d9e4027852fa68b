"""One named cause of what a graphed run did differently: the catalogue rule, the module, the user's
`file:line` and the fix, from evidence a graphed child gathered (graphdoctor.child.witness)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphdoctor.strict_json import nullable

FACTORIES: tuple[str, ...] = ("full", "tensor", "as_tensor", "scalar_tensor", "full_like", "fill_")
"""torch functions (and the Tensor method `fill_`) that turn host numbers into a device tensor: the subjects of
GD518 evidence of a host number baked into a graph while it was captured."""

HOOK = "hook"
"""Hazard rule of context evidence that names no rule: a hook the user's code registered (its registration
site, its function, what it is on), for the backward-side localization."""


@dataclass(frozen=True, slots=True)
class Cause:
    """A rule the run's evidence names, and whether it explains the row's difference."""

    rule: str
    name: str
    """The rule's name, e.g. `host-value-baked`."""
    severity: str
    """The rule's severity (error, warning, info)."""
    module: str
    """Qualified name of the module it concerns ("" when none: a loss function, a forward_step)."""
    location: str | None
    """The user's `file:line`."""
    message: str
    fix: str
    step: int | None = None
    also_at: tuple[str, ...] = ()
    explains: bool = False
    """True for the cause the row's diagnosis names (the evidence that accounts for the difference)."""
    phase: str | None = None
    """Phase at which the child saw the evidence (capture, replay, eval)."""
    subject: str | None = None
    """What the evidence is about: an attribute, a hook function, a torch function (FACTORIES)."""

    def line(self) -> str:
        """`GD518 host-value-baked: message (at file:line in module M); fix: ...`."""
        where = ", ".join(x for x in (f"at {self.location}" if self.location else "",
                                      f"in module {self.module}" if self.module else "") if x)
        return f"{self.rule} {self.name}: {self.message}" + (f" ({where})" if where else "") + f"; fix: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        """JSON view (docs/json.md, `impls[].causes`)."""
        return {"rule": self.rule, "name": self.name, "severity": self.severity, "module": self.module,
                "location": self.location, "also_at": list(self.also_at), "step": self.step,
                "message": self.message, "fix": self.fix, "explains": self.explains, "phase": self.phase,
                "subject": self.subject}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cause:
        """Inverse of to_dict."""
        return cls(rule=str(data["rule"]), name=str(data.get("name", "")), severity=str(data.get("severity", "")),
                   module=str(data.get("module") or ""),
                   location=nullable(str, data.get("location")),
                   message=str(data.get("message", "")), fix=str(data.get("fix", "")),
                   step=nullable(int, data.get("step")), also_at=tuple(str(a) for a in data.get("also_at") or ()),
                   explains=bool(data.get("explains", False)),
                   phase=nullable(str, data.get("phase")),
                   subject=nullable(str, data.get("subject")))


__all__ = ["FACTORIES", "HOOK", "Cause"]
