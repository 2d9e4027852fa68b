"""Results of `graphdoctor advise` per candidate, their ranking and the recommendation (pure Python).

A candidate either ran (its diff row: verdict, timing with spread, memory, launches), was rejected
before any GPU run (catalogue rule or Megatron's validation), is unavailable here, or was not run
(budget). The recommendation is the fastest candidate whose verdict passes (rng-divergence passes
unless strict_rng, as in diff) and whose speedup range lies above 1; when none does, "no graph
configuration is measurably faster".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphdoctor.advise.candidates import Candidate, Rejection
from graphdoctor.compare.verdict import ImplResult, Timing
from graphdoctor.config import DiffConfig
from graphdoctor.config.entry_points import TE_LAYER_SPECS
from graphdoctor.types import Verdict

RAN, REJECTED, UNAVAILABLE, NOT_RUN = "ran", "rejected", "unavailable", "not-run"
STATUSES: tuple[str, ...] = (RAN, REJECTED, UNAVAILABLE, NOT_RUN)

NOTHING_FASTER = "no graph configuration is measurably faster"


@dataclass(frozen=True, slots=True)
class CandidateResult:
    """What advise found for one candidate."""

    candidate: Candidate
    status: str
    """ran | rejected | unavailable | not-run."""
    result: ImplResult | None = None
    """diff's row for the candidate (status ran)."""
    rejections: tuple[Rejection, ...] = ()
    reason: str = ""
    """Why unavailable or not run."""
    warnings: tuple[str, ...] = ()
    """Warning-level catalogue findings for the candidate's configuration."""
    bisection: bool = False
    """Run by the bisection (a subset of scopes or layers), not one of the candidates."""

    @property
    def verdict(self) -> Verdict | None:
        """diff's verdict (None unless it ran)."""
        return self.result.verdict if self.result is not None else None

    @property
    def timing(self) -> Timing | None:
        """Steady-state timing (None unless it ran and finished)."""
        return self.result.timing if self.result is not None else None

    def passed(self, strict_rng: bool = False) -> bool:
        """The verdict passes as in diff: match, or rng-divergence unless strict_rng."""
        verdict = self.verdict
        if verdict is None or not verdict.passed:
            return False
        return not (strict_rng and verdict == Verdict.RNG_DIVERGENCE)

    def differs(self) -> bool | None:
        """For the bisection: differs numerically (True), matches or differs only in RNG (False),
        unknown (None: did not run or did not finish)."""
        verdict = self.verdict
        if verdict in (Verdict.NUMERIC_DIVERGENCE, Verdict.FROZEN_RNG):
            return True
        if verdict in (Verdict.MATCH, Verdict.RNG_DIVERGENCE):
            return False
        return None

    @property
    def speedup(self) -> float | None:
        """Median eager / median graphed step time."""
        return self.timing.speedup if self.timing is not None else None

    def measurably_faster(self) -> bool:
        """The speedup's whole range lies above 1."""
        timing = self.timing
        spread = timing.speedup_range if timing is not None else None
        return timing is not None and spread is not None and timing.measurable and spread[0] > 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON view (diff's row without the per-step records of its runs)."""
        return {"candidate": self.candidate.to_dict(), "status": self.status,
                "verdict": self.verdict.value if self.verdict is not None else None,
                "result": self.result.to_dict(include_steps=False) if self.result is not None else None,
                "rejections": [r.to_dict() for r in self.rejections], "reason": self.reason,
                "warnings": list(self.warnings), "bisection": self.bisection}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CandidateResult:
        """Inverse of to_dict."""
        result = data.get("result")
        return cls(candidate=Candidate.from_dict(data["candidate"]), status=str(data["status"]),
                   result=ImplResult.from_dict(result) if result else None,
                   rejections=tuple(Rejection.from_dict(r) for r in data.get("rejections", ())),
                   reason=str(data.get("reason", "")), warnings=tuple(data.get("warnings", ())),
                   bisection=bool(data.get("bisection", False)))


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The configuration to use, or why there is none."""

    candidate: Candidate | None
    """None: NOTHING_FASTER (or nothing passed)."""
    speedup: float | None = None
    speedup_range: tuple[float, float] | None = None
    graph_pool_bytes: int | None = None
    peak_reserved_over_eager: float | None = None
    flags: str = ""
    """Megatron-LM flags that select it."""
    reason: str = ""
    """One line: why this one, or why none."""
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"candidate": self.candidate.to_dict() if self.candidate else None, "speedup": self.speedup,
                "speedup_min": self.speedup_range[0] if self.speedup_range else None,
                "speedup_max": self.speedup_range[1] if self.speedup_range else None,
                "graph_pool_bytes": self.graph_pool_bytes,
                "peak_reserved_over_eager": self.peak_reserved_over_eager, "flags": self.flags,
                "reason": self.reason, "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recommendation:
        """Inverse of to_dict."""
        low, high = data.get("speedup_min"), data.get("speedup_max")
        cand = data.get("candidate")
        return cls(candidate=Candidate.from_dict(cand) if cand else None, speedup=data.get("speedup"),
                   speedup_range=(float(low), float(high)) if low is not None and high is not None else None,
                   graph_pool_bytes=data.get("graph_pool_bytes"),
                   peak_reserved_over_eager=data.get("peak_reserved_over_eager"),
                   flags=str(data.get("flags", "")), reason=str(data.get("reason", "")),
                   notes=tuple(data.get("notes", ())))


def megatron_flags(candidate: Candidate, config: DiffConfig) -> str:
    """The Megatron-LM launch flags (training/arguments.py of megatron-core 0.19) for a candidate.

    `--cuda-graph-modules` takes its values space-separated (nargs='+'); empty is the whole layer.
    full_iteration needs `--no-check-for-nan-in-loss-and-grad` (validate_args asserts it), and
    Megatron-LM turns `--te-rng-tracker` on by itself, with a warning, whenever Transformer Engine is
    the graph or the layer implementation (GD116): the flags say it.
    """
    parts = ["--cuda-graph-impl", candidate.impl]
    if candidate.modules and candidate.impl != "full_iteration":
        parts += ["--cuda-graph-modules", *candidate.modules]
    if candidate.impl == "full_iteration":
        parts.append("--no-check-for-nan-in-loss-and-grad")
    if candidate.impl == "transformer_engine" or config.layer_spec in TE_LAYER_SPECS:
        parts.append("--te-rng-tracker")
    return " ".join(parts)


def ranked(results: list[CandidateResult], strict_rng: bool = False) -> list[CandidateResult]:
    """The candidates (not bisection runs) that ran and passed, fastest first (unknown speed last)."""
    passing = [r for r in results if r.status == RAN and not r.bisection and r.passed(strict_rng)]
    return sorted(passing, key=lambda r: -(r.speedup or 0.0))


def recommend(results: list[CandidateResult], config: DiffConfig) -> Recommendation:
    """The fastest passing candidate whose speedup range lies above 1, or why there is none."""
    order = ranked(results, config.strict_rng)
    if not order:
        return Recommendation(None, reason="no candidate passed (every one that ran differs or failed)")
    faster = [r for r in order if r.measurably_faster()]
    if not faster:
        best = order[0]
        what = f"fastest passing: {best.candidate.label}" + (f" at {best.speedup:.2f}x" if best.speedup else "")
        return Recommendation(None, reason=f"{NOTHING_FASTER} ({what}, its speedup range includes 1)")
    best = faster[0]
    timing = best.timing
    memory = best.result.memory.report if best.result is not None and best.result.memory is not None else None
    ratio = None
    if memory is not None and memory.eager_peak_reserved_bytes:
        ratio = memory.peak_reserved_bytes / memory.eager_peak_reserved_bytes
    notes = [] if timing is None or timing.quiet else ["timed while another child used the GPU"]
    if best.verdict == Verdict.RNG_DIVERGENCE:
        notes.append("rng-divergence: dropout masks differ from eager, numerics match (the control pair)")
    return Recommendation(best.candidate, speedup=best.speedup,
                          speedup_range=timing.speedup_range if timing else None,
                          graph_pool_bytes=memory.graph_pool_reserved_bytes if memory is not None else None,
                          peak_reserved_over_eager=ratio, flags=megatron_flags(best.candidate, config),
                          reason="fastest candidate whose verdict passes and whose speedup range lies above 1",
                          notes=tuple(notes))


def exit_code(results: list[CandidateResult], strict_rng: bool = False) -> int:
    """0 when a candidate passed (recommended, or none measurably faster), 1 when none did."""
    return 0 if ranked(results, strict_rng) else 1


__all__ = ["NOTHING_FASTER", "NOT_RUN", "RAN", "REJECTED", "STATUSES", "UNAVAILABLE", "CandidateResult",
           "Recommendation", "exit_code", "megatron_flags", "ranked", "recommend"]
