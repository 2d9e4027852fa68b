"""The Rule base class: metadata as class attributes, detection as `detect(ctx) -> hits`.

A rule names one bad pattern. Static rules implement `detect`; runtime rules (GD5xx) only carry
metadata and are reported by the probes through `Rule.finding(...)`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from graphdoctor.rules.finding import Finding, FixAvailability, Severity, Status

if TYPE_CHECKING:
    from graphdoctor.rules.context import CheckContext

DOC_SECTIONS: tuple[str, ...] = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix")
"""Sections every rule docstring must have, in this order (Known problems is optional)."""

OPTIONAL_SECTIONS: tuple[str, ...] = ("Known problems",)

CODE_PATTERN = re.compile(r"^GD[1-9][0-9]{2}$")
NAME_PATTERN = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)+$")


@dataclass(frozen=True, slots=True)
class Hit:
    """One match of a rule: the keys involved and the values for the message template."""

    fields: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)
    severity: Severity | None = None
    """Overrides the rule's default severity for this hit (e.g. error only for one impl)."""


class Rule:
    """Base class of every catalogue rule; subclasses set the ClassVars and a docstring."""

    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    fix: ClassVar[FixAvailability]
    status: ClassVar[Status] = Status.STABLE
    since: ClassVar[str] = "0.1"
    applies_to_inference: ClassVar[bool] = False
    """True for rules that also judge a run whose graphs are inference graphs only (Megatron-LM's inference
    scripts, train_rl.py without --rl-training-cuda-graphs): flag spellings and the installation; the others are
    about graphs replayed in training."""
    runtime: ClassVar[bool] = False
    """True for rules detected at run time on the GPU; `detect` then never reports."""
    detected_by: ClassVar[str] = "runtime probes (`graphdoctor check --probe`)"
    """For runtime rules: what finds them (shown in `graphdoctor rule` and the docs)."""
    template: ClassVar[str]
    """`str.format` template for message(), filled from Hit.params."""
    fix_template: ClassVar[str]
    """Imperative `str.format` template for fix_title()."""
    family: ClassVar[str] = ""
    """Set by the registry from the module's FAMILY."""
    machine_facts: ClassVar[tuple[str, ...]] = ()
    """EnvironmentFacts fields about the training machine's installation this rule reads; when one
    is unknown (no `--target`) the rule reports "not checked" where the answer would matter."""
    machine_question: ClassVar[str] = ""
    """What the unknown machine would have to answer, e.g. `is Transformer Engine installed there?`."""

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        """Yield one Hit per occurrence in `ctx` (static rules override this)."""
        return iter(())

    def message(self, **params: Any) -> str:
        """What went wrong and where, e.g. `cpu_offloading=True with cuda_graph_impl='local'`."""
        return self.template.format(**params)

    def fix_title(self, **params: Any) -> str:
        """Imperative instruction, e.g. `Set cuda_graph_impl='full_iteration' or turn off cpu_offloading`."""
        return self.fix_template.format(**params)

    def finding(
        self,
        *,
        fields: tuple[str, ...] = (),
        locations: tuple[str, ...] = (),
        severity: Severity | None = None,
        source: str = "static",
        extra: dict[str, Any] | None = None,
        **params: Any,
    ) -> Finding:
        """Build a Finding of this rule (probes call this with `locations`, `extra` and message params)."""
        return Finding(
            code=self.code,
            name=self.name,
            severity=severity or self.severity,
            message=self.message(**params),
            fix=self.fix_title(**params),
            fields=fields,
            locations=locations,
            source=source,
            extra=dict(extra or {}),
        )

    def not_checked(self, *, fields: tuple[str, ...] = (), locations: tuple[str, ...] = ()) -> Finding:
        """The info finding of a machine rule whose answer depends on an unknown training machine."""
        question = f" ({self.machine_question})" if self.machine_question else ""
        return Finding(
            code=self.code,
            name=self.name,
            severity=Severity.INFO,
            message=f"not checked: the training machine is unknown{question}",
            fix="Pass --target: a file from `graphdoctor env --json` on the training machine, te=..,torch=.., or local",
            fields=fields,
            locations=locations,
            extra={"not_checked": True},
        )

    @classmethod
    def doc(cls) -> str:
        """The full rule documentation (the class docstring, dedented)."""
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def summary(cls) -> str:
        """First paragraph of "What it does"."""
        text = cls.doc_sections().get("What it does", "")
        return " ".join(text.split("\n\n")[0].split())

    @classmethod
    def doc_sections(cls) -> dict[str, str]:
        """Docstring split into `## Section` -> body."""
        sections: dict[str, str] = {}
        current: str | None = None
        lines: list[str] = []
        for line in cls.doc().splitlines():
            if line.startswith("## "):
                if current is not None:
                    sections[current] = "\n".join(lines).strip()
                current, lines = line[3:].strip(), []
            elif current is not None:
                lines.append(line)
        if current is not None:
            sections[current] = "\n".join(lines).strip()
        return sections

    @classmethod
    def metadata(cls) -> dict[str, Any]:
        """Plain-data description used by `graphdoctor rule --format json` and the docs."""
        return {
            "code": cls.code,
            "name": cls.name,
            "family": cls.family,
            "severity": cls.severity.value,
            "fix": cls.fix.value,
            "fix_availability": cls.fix.describe(),
            "status": cls.status.value,
            "since": cls.since,
            "runtime": cls.runtime,
            "applies_to_inference": cls.applies_to_inference,
            "machine_facts": list(cls.machine_facts),
            "summary": cls.summary(),
            "explanation": cls.doc(),
        }


__all__ = ["CODE_PATTERN", "DOC_SECTIONS", "NAME_PATTERN", "OPTIONAL_SECTIONS", "Hit", "Rule"]
