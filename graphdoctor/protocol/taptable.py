"""The tap table a child writes (`forensics`, format version 1): tap sites, per-step rows of statistics,
and its parsing with one-line errors that name the field. The analysis that pairs an eager and a graphed
table is graphdoctor.compare.forensics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphdoctor.errors import GraphDoctorError
from graphdoctor.strict_json import is_non_finite_text, json_safe, nullable

FORMAT_VERSION = 1
"""The `forensics` format version this module reads (and that `Forensics.to_dict` writes)."""

DRAW_KINDS: tuple[str, ...] = ("dropout", "random", "host-random")
"""Kinds that record a random draw (mirrors compare.fingerprint.DRAW_KINDS, which imports torch)."""

VALUE_KINDS: tuple[str, ...] = ("output", "grad", "input-grad")
"""Kinds that record a module output or the gradient w.r.t. it."""

PHASES: tuple[str, ...] = ("eager", "warmup", "capture", "replay")
"""Step phases a child may report."""

Stats = tuple[float, float, float]


class ForensicsError(GraphDoctorError, ValueError):
    """A `forensics` dict is missing, reports that its taps failed, or has the wrong shape."""


@dataclass(frozen=True, slots=True)
class Site:
    """One tap site (one table slot): one call site, one occurrence."""

    slot: int
    """Row index in the child's table; differs between runs, never used for pairing."""
    kind: str
    module: str
    """Qualified module name ("" when the draw ran outside any module)."""
    op: str
    """The tapped op ("aten.native_dropout", "forward", ...)."""
    location: str | None
    """file:line of the call site, when known."""
    numel: int
    p: float | None
    """Dropout probability (dropout sites only)."""
    captured: bool
    """Whether the tap was captured into a CUDA graph."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view (an entry of `sites`)."""
        return {"slot": self.slot, "kind": self.kind, "module": self.module or None, "op": self.op,
                "location": self.location, "numel": self.numel, "p": self.p, "captured": self.captured}

    @classmethod
    def from_dict(cls, data: Any, where: str = "site") -> Site:
        """Parse one entry of `sites` (`where` names it in messages); raises ForensicsError."""
        obj: Mapping[str, Any] = _check(data, Mapping, where)
        kind = _get(obj, "kind", str, where)
        if kind not in DRAW_KINDS + VALUE_KINDS:
            raise ForensicsError(f"{where}.kind: got {kind!r}, expected one of {DRAW_KINDS + VALUE_KINDS}")
        p = _get(obj, "p", (int, float), where, nullable=True)
        return cls(slot=_get(obj, "slot", int, where), kind=kind,
                   module=_get(obj, "module", str, where, nullable=True) or "",
                   op=_get(obj, "op", str, where), location=_get(obj, "location", str, where, nullable=True),
                   numel=_get(obj, "numel", int, where), p=nullable(float, p),
                   captured=_get(obj, "captured", bool, where))


@dataclass(frozen=True, slots=True)
class TapRow:
    """One fingerprint written by one tap during one step."""

    slot: int
    seq: int
    """Execution sequence number (the order of the writes)."""
    stats: Stats
    """The three statistics (see compare.fingerprint.STAT_NAMES)."""

    @classmethod
    def from_list(cls, data: Any, where: str = "row") -> TapRow:
        """Parse `[slot, seq, s0, s1, s2]`, stats numbers or "nan"/"inf"/"-inf"; raises ForensicsError."""
        if not isinstance(data, (list, tuple)) or len(data) != 5:  # slot, seq, 3 stats
            raise ForensicsError(f"{where}: got {data!r}, expected [slot, seq, s0, s1, s2]")
        slot, seq = (_check(v, int, f"{where}[{i}]") for i, v in enumerate(data[:2]))
        s0, s1, s2 = (parse_stat(v, f"{where}[{i + 2}]") for i, v in enumerate(data[2:]))
        return cls(slot=slot, seq=seq, stats=(s0, s1, s2))


@dataclass(frozen=True, slots=True)
class StepRows:
    """The rows written during one training step."""

    step: int
    phase: str
    """eager | warmup | capture | replay."""
    rows: tuple[TapRow, ...]
    """Sorted by seq (execution order)."""

    @classmethod
    def from_dict(cls, data: Any, where: str = "step") -> StepRows:
        """Parse one entry of `steps` (`where` names it in messages); raises ForensicsError."""
        obj: Mapping[str, Any] = _check(data, Mapping, where)
        phase = _get(obj, "phase", str, where)
        if phase not in PHASES:
            raise ForensicsError(f"{where}.phase: got {phase!r}, expected one of {PHASES}")
        rows = [TapRow.from_list(r, f"{where}.rows[{i}]")
                for i, r in enumerate(_get(obj, "rows", list, where))]
        return cls(step=_get(obj, "step", int, where), phase=phase,
                   rows=tuple(sorted(rows, key=lambda r: r.seq)))


@dataclass(frozen=True, slots=True)
class TapTable:
    """A child's whole `forensics` dict, parsed."""

    capacity: int
    truncated: bool
    """More sites asked for a slot than `capacity`; the later ones were not tapped."""
    sites: Mapping[int, Site]
    """By slot."""
    steps: tuple[StepRows, ...]
    error: str | None = None
    """Why the taps failed, when they did (the run went on)."""
    num_bytes: int = 0
    """Device memory the taps owned."""
    notes: tuple[str, ...] = ()
    """What the taps could not do (a failed tap, captures beyond the stamp capacity)."""
    num_graph_nodes: int | None = None
    """Nodes the taps added to the run's captured graphs (counted at capture); None where unknown."""

    def to_dict(self) -> dict[str, Any]:
        """The version-1 `forensics` dict (the inverse of from_dict)."""
        out: dict[str, Any] = {
            "version": FORMAT_VERSION, "capacity": self.capacity, "num_slots": len(self.sites),
            "truncated": self.truncated, "num_bytes": self.num_bytes, "num_graph_nodes": self.num_graph_nodes,
            "notes": list(self.notes),
            "sites": [site.to_dict() for _, site in sorted(self.sites.items())],
            "steps": [{"step": s.step, "phase": s.phase,
                       "rows": [[r.slot, r.seq, *(json_safe(v) for v in r.stats)] for r in s.rows]}
                      for s in self.steps]}
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def failed(cls, error: str) -> TapTable:
        """The table of a run whose taps failed (the run went on without them)."""
        return cls(capacity=0, truncated=False, sites={}, steps=(), error=error[:500])

    @classmethod
    def from_dict(cls, data: Any, where: str = "forensics") -> TapTable:
        """Parse a version-1 `forensics` dict; raises ForensicsError (bad field, duplicate, orphan row)."""
        obj: Mapping[str, Any] = _check(data, Mapping, where)
        if obj.get("version") != FORMAT_VERSION:
            raise ForensicsError(f"{where}.version: got {obj.get('version')!r}, expected {FORMAT_VERSION}")
        sites: dict[int, Site] = {}
        for i, raw in enumerate(_get(obj, "sites", list, where)):
            site = Site.from_dict(raw, f"{where}.sites[{i}]")
            if site.slot in sites:
                raise ForensicsError(f"{where}.sites[{i}].slot: got duplicate {site.slot}, expected unique")
            sites[site.slot] = site
        steps = [StepRows.from_dict(s, f"{where}.steps[{i}]")
                 for i, s in enumerate(_get(obj, "steps", list, where))]
        if len({s.step for s in steps}) != len(steps):
            raise ForensicsError(f"{where}.steps: got duplicate step numbers, expected unique")
        orphan = next(((s.step, r) for s in steps for r in s.rows if r.slot not in sites), None)
        if orphan is not None:
            raise ForensicsError(f"{where}.steps (step {orphan[0]}, seq {orphan[1].seq}): got slot "
                                 f"{orphan[1].slot}, expected a slot listed in {where}.sites")
        return cls(capacity=_get(obj, "capacity", int, where), truncated=_get(obj, "truncated", bool, where),
                   sites=sites, steps=tuple(sorted(steps, key=lambda s: s.step)),
                   error=_get(obj, "error", str, where, nullable=True),
                   num_bytes=int(obj.get("num_bytes") or 0),
                   notes=tuple(str(n) for n in obj.get("notes") or ()),
                   num_graph_nodes=_get(obj, "num_graph_nodes", int, where, nullable=True))


def _check(value: Any, expected: type | tuple[type, ...], where: str) -> Any:
    types = expected if isinstance(expected, tuple) else (expected,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = " or ".join(t.__name__ for t in types)
        raise ForensicsError(f"{where}: got {value!r} ({type(value).__name__}), expected {names}")
    return value


def _get(obj: Mapping[str, Any], name: str, expected: type | tuple[type, ...], where: str, *,
         nullable: bool = False) -> Any:
    if nullable and obj.get(name) is None:
        return None
    if name not in obj:
        raise ForensicsError(f"{where}.{name}: got nothing (field missing), expected a value")
    return _check(obj[name], expected, f"{where}.{name}")


def parse_stat(value: Any, where: str) -> float:
    """One statistic of a row: a number, or the strict-JSON text of a non-finite one ("NaN", "Infinity")."""
    if is_non_finite_text(value):
        return float(value)
    return float(_check(value, (int, float), where))


def unstrict_floats(data: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """`data` with the statistics `names` read back from strict JSON (parse_stat)."""
    values = dict(data)
    for name in names:
        if values.get(name) is not None:
            values[name] = parse_stat(values[name], name)
    return values


__all__ = ["DRAW_KINDS", "FORMAT_VERSION", "PHASES", "VALUE_KINDS", "ForensicsError", "Site", "Stats", "StepRows",
           "TapRow", "TapTable", "parse_stat", "unstrict_floats"]
