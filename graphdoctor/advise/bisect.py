"""Bisection of a numeric divergence to the smallest graphed part that still differs (pure logic).

Given a candidate that differs from eager, the planner first runs its scopes one at a time (a whole
layer splits into attention and MLP, or attention and MoE; not under `local`, GD219), then halves the graphed layers (binary
search over `graph_layers`) until one layer is left, or neither half differs alone, or the budget
ends. It asks a `judge(candidate) -> True | False | None` (differs / matches / unknown: failed, not
run, or refused) and never runs anything itself, so a recorded set of verdicts replays the sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from graphdoctor.advise.candidates import Candidate
from graphdoctor.strict_json import nullable

Judge = Callable[[Candidate], "bool | None"]
"""Differs from eager (True), matches (False), or could not tell (None)."""

WHOLE_LAYER_PARTS: tuple[tuple[str, ...], ...] = (("attn",), ("mlp",))
WHOLE_MOE_LAYER_PARTS: tuple[tuple[str, ...], ...] = (("attn",), ("moe",))


@dataclass(frozen=True, slots=True)
class BisectStep:
    """One question the bisection asked and its answer."""

    stage: str
    """`scope` or `layers`."""
    candidate: Candidate
    differs: bool | None

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"stage": self.stage, "candidate": self.candidate.to_dict(), "differs": self.differs}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BisectStep:
        """Inverse of to_dict."""
        return cls(stage=str(data["stage"]), candidate=Candidate.from_dict(data["candidate"]),
                   differs=nullable(bool, data.get("differs")))


@dataclass(frozen=True, slots=True)
class Bisection:
    """Where a divergence was narrowed to."""

    start: Candidate
    narrowed: Candidate
    """The smallest graphed part found that still differs."""
    steps: tuple[BisectStep, ...]
    stopped: str
    """Why it stopped: `one layer`, `one scope, one layer`, `needs both halves`, `scopes differ only together`,
    `unknown verdict`, `budget`."""
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"start": self.start.to_dict(), "narrowed": self.narrowed.to_dict(),
                "steps": [s.to_dict() for s in self.steps], "stopped": self.stopped, "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Bisection:
        """Inverse of to_dict."""
        return cls(start=Candidate.from_dict(data["start"]), narrowed=Candidate.from_dict(data["narrowed"]),
                   steps=tuple(BisectStep.from_dict(s) for s in data.get("steps", ())),
                   stopped=str(data["stopped"]), notes=tuple(data.get("notes", ())))


def scope_parts(candidate: Candidate, *, moe: bool) -> list[tuple[str, ...]]:
    """The candidate's scopes one at a time (moe_preprocess stays with moe_router, which it needs).
    A `local` candidate is one part: megatron-core 0.19.2's GPT layers graph the whole layer for `attn`
    / `mlp` and nothing for the MoE scopes (GD219), so its divergence is bisected over layers only."""
    if candidate.impl == "local":
        return [candidate.modules]
    if not candidate.modules:
        return list(WHOLE_MOE_LAYER_PARTS if moe else WHOLE_LAYER_PARTS)
    parts: list[tuple[str, ...]] = []
    for module in candidate.modules:
        if module == "moe_preprocess" and "moe_router" in candidate.modules:
            continue
        if module == "moe_router" and "moe_preprocess" in candidate.modules:
            parts.append(("moe_router", "moe_preprocess"))
        else:
            parts.append((module,))
    return parts


def bisect(start: Candidate, num_layers: int, judge: Judge, *, moe: bool = False) -> Bisection:
    """Narrow a differing candidate: scope by scope, then layer by layer.

    Args:
        start: a candidate that differs from eager (not full_iteration: it graphs the whole step).
        num_layers: decoder layers of the model.
        judge: answers whether a candidate differs; None ends the bisection (failed, not run, refused).
        moe: the model has MoE layers (a whole layer then splits into attention and MoE).
    """
    steps: list[BisectStep] = []
    notes: list[str] = []

    def ask(stage: str, candidate: Candidate) -> bool | None:
        answer = judge(candidate)
        steps.append(BisectStep(stage, candidate, answer))
        return answer

    scope = start
    parts = scope_parts(start, moe=moe)
    if len(parts) > 1:
        differing = []
        for part in parts:
            answer = ask("scope", Candidate(start.impl, part))
            if answer is None:
                return Bisection(start, scope, tuple(steps), "unknown verdict", tuple(notes))
            if answer:
                differing.append(part)
        if not differing:
            notes.append(f"no scope of {start.label} differs alone: only together")
            if num_layers < 2:
                return Bisection(start, scope, tuple(steps), "scopes differ only together", tuple(notes))
        else:
            scope = Candidate(start.impl, differing[0])
            if len(differing) > 1:
                notes.append("these scopes differ too, each alone: " + ", ".join("+".join(p) for p in differing[1:]))
    layers, stopped = _halve(scope, num_layers, ask)
    narrowed = Candidate(scope.impl, scope.modules, layers if len(layers) < num_layers else ())
    return Bisection(start, narrowed, tuple(steps), stopped, tuple(notes))


def _halve(scope: Candidate, num_layers: int, ask: Callable[[str, Candidate], bool | None]
           ) -> tuple[tuple[int, ...], str]:
    """Binary search over the graphed layers of a differing scope -> (layers, why it stopped)."""
    current = tuple(range(num_layers))
    while len(current) > 1:
        half = len(current) // 2
        first, second = current[:half], current[half:]
        answer = ask("layers", Candidate(scope.impl, scope.modules, first))
        if answer is None:
            return current, "unknown verdict"
        if answer:
            current = first
            continue
        answer = ask("layers", Candidate(scope.impl, scope.modules, second))
        if answer is None:
            return current, "unknown verdict"
        if not answer:
            return current, "needs both halves"
        current = second
    return current, "one layer"


def bisect_start(candidates: list[tuple[Candidate, bool | None]]) -> list[Candidate]:
    """The candidates to bisect: per implementation, the widest one that differs (whole layer first,
    then the one with most scopes), never full_iteration (one graph of the whole step)."""
    chosen: dict[str, Candidate] = {}
    for candidate, differs in candidates:
        if not differs or candidate.impl == "full_iteration" or candidate.layers:
            continue
        best = chosen.get(candidate.impl)
        if best is None or _width(candidate) > _width(best):
            chosen[candidate.impl] = candidate
    return list(chosen.values())


def _width(candidate: Candidate) -> int:
    return 1000 if not candidate.modules else len(candidate.modules)


__all__ = ["BisectStep", "Bisection", "Judge", "bisect", "bisect_start", "scope_parts"]
