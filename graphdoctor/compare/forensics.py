"""RNG/dropout forensics: pair the tap tables (graphdoctor.protocol.taptable) of an eager and a graphed run,
and find frozen draws and the first divergent tap. Pure Python over the children's `forensics` dicts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from graphdoctor.protocol.taptable import (
    DRAW_KINDS,
    FORMAT_VERSION,
    PHASES,
    VALUE_KINDS,
    ForensicsError,
    Site,
    Stats,
    StepRows,
    TapRow,
    TapTable,
    parse_stat,
    unstrict_floats,
)
from graphdoctor.strict_json import json_safe

ANOMALY_SIGMAS = 6.0
"""A dropout keep rate this many binomial standard deviations off 1 - p is an anomaly."""

_Key = tuple[str, str, str, int]  # kind, module, op, occurrence within the step


@dataclass(frozen=True, slots=True)
class SiteSummary:
    """One (kind, module, op, occurrence) tap of the graphed run, over the compared steps."""

    kind: str
    module: str
    op: str
    occurrence: int
    """k-th time this (kind, module, op) ran within a step (microbatches, recomputation)."""
    location: str | None
    """The graphed site's location, else the reference's."""
    captured: bool
    """The graphed site was captured into a CUDA graph (on some compared step)."""
    numel: int
    num_steps_seen: int
    """Compared steps where the graphed run wrote this tap (paired or not)."""
    keep_rate: float | None
    """Dropout only: mean kept fraction (s0 / numel) of the graphed masks over those steps."""
    expected_keep_rate: float | None
    """Dropout only: 1 - p."""
    keep_rate_sigmas: float | None
    """Dropout only: |keep_rate - expected| in binomial standard deviations (inf if off and p is 0 or 1)."""
    num_steps_compared: int
    """Compared steps where this tap was paired with the reference."""
    num_steps_identical: int
    """Of those, steps where the three statistics match."""
    replay_steps: tuple[int, ...]
    """Paired replay steps."""
    repeats_across_replays: bool
    """The graphed fingerprint is the same on every replay step (at least 2)."""
    reference_changes: bool
    """The reference fingerprint is not the same on those steps."""


@dataclass(frozen=True, slots=True)
class FrozenDraw:
    """A draw the graph replays unchanged while eager draws new values every step (frozen-rng)."""

    kind: str
    module: str
    op: str
    location: str | None
    first_step: int
    """First replay step."""
    num_replay_steps: int


@dataclass(frozen=True, slots=True)
class TapDivergence:
    """A paired tap whose statistics differ: where, and by how much."""

    step: int
    phase: str
    """The graphed run's phase of that step."""
    kind: str
    module: str
    op: str
    occurrence: int
    location: str | None
    reference: Stats
    graphed: Stats
    max_abs: float
    """max over the three statistics of |a - b| (NaN when exactly one side is NaN)."""
    max_rel: float
    """max over the three statistics of |a - b| / max(|a|, |b|) (0 where both are 0)."""


@dataclass(frozen=True, slots=True)
class SkippedStep:
    """A step left out of the comparison, and why."""

    step: int
    reason: str


@dataclass(frozen=True, slots=True)
class Forensics:
    """Result of `analyze`: per-site summaries and the findings drawn from them."""

    compared_steps: tuple[int, ...]
    skipped_steps: tuple[SkippedStep, ...]
    num_unpaired: int
    """Rows of the compared steps, both runs together, with no counterpart in the other run."""
    rng_aligned: bool | None
    """True: every paired draw identical; False: some differed; None: no draw was paired."""
    sites: tuple[SiteSummary, ...]
    """In graphed execution order of first appearance."""
    frozen: tuple[FrozenDraw, ...]
    first_divergence: TapDivergence | None
    """First differing pair (steps ascending, reference execution order within a step)."""
    first_numeric_divergence: TapDivergence | None
    """First differing output/grad pair in a step that, like every earlier one, has identical draws."""
    first_draw_mismatch: TapDivergence | None
    """First differing draw pair: the random streams are not aligned from there on."""
    keep_rate_anomalies: tuple[SiteSummary, ...]
    """Dropout sites whose keep_rate_sigmas exceeds ANOMALY_SIGMAS."""
    notes: tuple[str, ...]
    first_backward_divergence: TapDivergence | None = None
    """First differing gradient tap (w.r.t. a module's output or input) in backward execution order, in the
    steps `first_numeric_divergence` looks at."""
    first_input_grad_divergence: TapDivergence | None = None
    """First module whose input gradient differs there: where the backward first changes a gradient."""

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON: "version", then every field by name; non-finite floats as "nan"/"inf"/"-inf"."""
        return {"version": FORMAT_VERSION, **json_safe(asdict(self))}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Forensics:
        """Inverse of to_dict (the `forensics` section of a saved diff report)."""
        def summary(d: Mapping[str, Any]) -> SiteSummary:
            values = unstrict_floats(d, ("keep_rate", "expected_keep_rate", "keep_rate_sigmas"))
            values["replay_steps"] = tuple(values.get("replay_steps", ()))
            return SiteSummary(**values)

        def divergence(d: Mapping[str, Any] | None) -> TapDivergence | None:
            if d is None:
                return None
            values = unstrict_floats(d, ("max_abs", "max_rel"))
            values["reference"] = tuple(parse_stat(v, "reference") for v in d["reference"])
            values["graphed"] = tuple(parse_stat(v, "graphed") for v in d["graphed"])
            return TapDivergence(**values)

        return cls(
            compared_steps=tuple(data.get("compared_steps", ())),
            skipped_steps=tuple(SkippedStep(**s) for s in data.get("skipped_steps", ())),
            num_unpaired=int(data.get("num_unpaired", 0)), rng_aligned=data.get("rng_aligned"),
            sites=tuple(summary(s) for s in data.get("sites", ())),
            frozen=tuple(FrozenDraw(**f) for f in data.get("frozen", ())),
            first_divergence=divergence(data.get("first_divergence")),
            first_numeric_divergence=divergence(data.get("first_numeric_divergence")),
            first_draw_mismatch=divergence(data.get("first_draw_mismatch")),
            keep_rate_anomalies=tuple(summary(s) for s in data.get("keep_rate_anomalies", ())),
            notes=tuple(data.get("notes", ())),
            first_backward_divergence=divergence(data.get("first_backward_divergence")),
            first_input_grad_divergence=divergence(data.get("first_input_grad_divergence")))


@dataclass(frozen=True, slots=True)
class _Pair:
    key: _Key
    reference: Site
    graphed: Site
    ref_stats: Stats
    graphed_stats: Stats


@dataclass(frozen=True, slots=True)
class _ComparedStep:
    step: int
    phase: str
    pairs: tuple[_Pair, ...]  # in reference execution order
    graphed: dict[_Key, tuple[Site, Stats]]  # every graphed row, in graphed execution order


def forensics_unavailable(reference: Any, graphed: Any) -> str | None:
    """Why `analyze` cannot run on this pair of `forensics` dicts, or None when it can.

    A side is unavailable when absent (None) or when it reports an "error" and wrote no row; one with an
    "error" and some rows is analyzed and the error goes into `Forensics.notes`. Shape is not checked.
    """
    for name, side in (("reference", reference), ("graphed", graphed)):
        if side is None:
            return f"{name} run reported no forensics (taps not installed)"
        if isinstance(side, TapTable):
            if side.error and not any(s.rows for s in side.steps):
                return f"{name} run's forensics taps failed: {side.error}"
            continue
        if isinstance(side, Mapping) and side.get("error"):
            steps = side.get("steps")
            if not any(isinstance(s, Mapping) and s.get("rows") for s in steps or ()):
                return f"{name} run's forensics taps failed: {side['error']}"
    return None


GRAD_KINDS: tuple[str, ...] = ("grad", "input-grad")
"""Tap kinds written during the backward."""


def analyze(reference: Any, graphed: Any, *, dropout: float, rtol: float = 0.0,
            atol: float = 0.0) -> Forensics:
    """Pair the taps of an eager reference run and a graphed run, and localize what differs.

    Rows pair by (kind, module, op, k-th occurrence in the step), never by slot. Compared steps: those in
    both runs whose graphed phase is not "capture". Draws compare exactly (a mask is the same or it is
    not); outputs and grads differ where |a - b| > atol + rtol * |reference| (exactly, NaN equal to NaN,
    when rtol == atol == 0 or a value is not finite).

    Args:
        reference: the eager run's tap table (a TapTable or its `forensics` dict).
        graphed: the graphed run's tap table (a TapTable or its `forensics` dict).
        dropout: configured dropout probability, for dropout sites that do not record their p.
        rtol: relative tolerance for output/grad statistics.
        atol: absolute tolerance for output/grad statistics.

    Returns:
        Per-site summaries and findings.

    Raises:
        ForensicsError: (a ValueError) a side is unavailable (see `forensics_unavailable`) or malformed.
    """
    reason = forensics_unavailable(reference, graphed)
    if reason is not None:
        raise ForensicsError(reason)
    ref = reference if isinstance(reference, TapTable) else TapTable.from_dict(reference, "reference.forensics")
    gr = graphed if isinstance(graphed, TapTable) else TapTable.from_dict(graphed, "graphed.forensics")
    compared, skipped, num_unpaired = _pair_steps(ref, gr)

    def differs(pair: _Pair) -> bool:
        return _differs(pair.ref_stats, pair.graphed_stats, pair.key[0] in DRAW_KINDS, rtol, atol)

    mismatch = _first(compared, lambda p: p.key[0] in DRAW_KINDS and differs(p))
    clean = [c for c in compared if mismatch is None or c.step < mismatch.step]
    sites = tuple(_summaries(compared, differs, dropout))
    has_draws = any(p.key[0] in DRAW_KINDS for c in compared for p in c.pairs)
    notes = [f"{name} tap table truncated at {t.capacity} slots: later sites were not tapped"
             for name, t in (("reference", ref), ("graphed", gr)) if t.truncated]
    notes += [f"{name} taps reported an error (results may be partial): {t.error}"
              for name, t in (("reference", ref), ("graphed", gr)) if t.error]
    if not compared:
        notes.append("no step could be compared (no step is in both runs outside graph capture)")
    return Forensics(
        compared_steps=tuple(c.step for c in compared), skipped_steps=tuple(skipped),
        num_unpaired=num_unpaired, rng_aligned=(mismatch is None) if has_draws else None, sites=sites,
        frozen=tuple(FrozenDraw(kind=s.kind, module=s.module, op=s.op, location=s.location,
                                first_step=s.replay_steps[0], num_replay_steps=len(s.replay_steps))
                     for s in sites
                     if s.kind in DRAW_KINDS and s.repeats_across_replays and s.reference_changes),
        first_divergence=_first(compared, differs),
        first_numeric_divergence=_first(clean, lambda p: p.key[0] in VALUE_KINDS and differs(p)),
        first_draw_mismatch=mismatch, notes=tuple(notes),
        first_backward_divergence=_first(clean, lambda p: p.key[0] in GRAD_KINDS and differs(p)),
        first_input_grad_divergence=_first(clean, lambda p: p.key[0] == "input-grad" and differs(p)),
        keep_rate_anomalies=tuple(s for s in sites if (s.keep_rate_sigmas or 0.0) > ANOMALY_SIGMAS))


def _pair_steps(ref: TapTable, gr: TapTable) -> tuple[list[_ComparedStep], list[SkippedStep], int]:
    ref_steps = {s.step: s for s in ref.steps}
    gr_steps = {s.step: s for s in gr.steps}
    compared: list[_ComparedStep] = []
    skipped: list[SkippedStep] = []
    num_unpaired = 0
    for step in sorted(ref_steps.keys() | gr_steps.keys()):
        reason = ("only in the reference run" if step not in gr_steps else "only in the graphed run"
                  if step not in ref_steps else None)
        if reason is not None:
            skipped.append(SkippedStep(step, reason))
            continue
        ref_keyed, gr_keyed = _keyed(ref, ref_steps[step]), _keyed(gr, gr_steps[step])
        if gr_steps[step].phase == "capture" and not gr_keyed.keys() <= ref_keyed.keys():
            # Warmup passes inside the capture step add rows and shift occurrences (local,
            # full_iteration); a capture step without them (transformer_engine, whose warmups run
            # without module hooks) is compared like any other.
            skipped.append(SkippedStep(step, "graphed capture step, whose warmup passes add rows"))
            continue
        pairs = tuple(_Pair(key, r_site, gr_keyed[key][0], r_stats, gr_keyed[key][1])
                      for key, (r_site, r_stats) in ref_keyed.items() if key in gr_keyed)
        num_unpaired += len(ref_keyed.keys() ^ gr_keyed.keys())
        compared.append(_ComparedStep(step, gr_steps[step].phase, pairs, gr_keyed))
    return compared, skipped, num_unpaired


def _keyed(table: TapTable, step: StepRows) -> dict[_Key, tuple[Site, Stats]]:
    """Rows of one step by pairing key, in execution order."""
    counts: dict[tuple[str, str, str], int] = {}
    out: dict[_Key, tuple[Site, Stats]] = {}
    for row in step.rows:
        site = table.sites[row.slot]
        base = (site.kind, site.module, site.op)
        counts[base] = counts.get(base, -1) + 1
        out[(*base, counts[base])] = (site, row.stats)
    return out


def _first(compared: Sequence[_ComparedStep], pick: Callable[[_Pair], bool]) -> TapDivergence | None:
    found = next(((p, c) for c in compared for p in c.pairs if pick(p)), None)
    if found is None:
        return None
    pair, c = found
    kind, module, op, occurrence = pair.key
    max_abs, max_rel = _sizes(pair.ref_stats, pair.graphed_stats)
    return TapDivergence(step=c.step, phase=c.phase, kind=kind, module=module, op=op, occurrence=occurrence,
                         location=pair.graphed.location or pair.reference.location,
                         reference=pair.ref_stats, graphed=pair.graphed_stats, max_abs=max_abs,
                         max_rel=max_rel)


def _summaries(compared: Sequence[_ComparedStep], differs: Callable[[_Pair], bool],
               dropout: float) -> list[SiteSummary]:
    seen: dict[_Key, list[tuple[Site, Stats]]] = {}  # graphed rows
    paired: dict[_Key, list[tuple[int, str, _Pair]]] = {}
    for c in compared:
        for key, (site, stats) in c.graphed.items():
            seen.setdefault(key, []).append((site, stats))
        for pair in c.pairs:
            paired.setdefault(pair.key, []).append((c.step, c.phase, pair))
    out = []
    for key, observed in seen.items():
        pairs = [p for _, _, p in paired.get(key, [])]
        replays = [(step, p) for step, phase, p in paired.get(key, []) if phase == "replay"]
        repeats = len(replays) >= 2 and _all_same([p.graphed_stats for _, p in replays])
        changes = len(replays) >= 2 and not _all_same([p.ref_stats for _, p in replays])
        site = observed[-1][0]
        keep_rate = expected = None
        if key[0] == "dropout" and all(s.numel > 0 for s, _ in observed):
            keep_rate = sum(stats[0] / s.numel for s, stats in observed) / len(observed)
            expected = 1.0 - (dropout if site.p is None else site.p)
        location = next((s.location for s, _ in observed if s.location), None)
        out.append(SiteSummary(
            kind=key[0], module=key[1], op=key[2], occurrence=key[3],
            location=location or next((p.reference.location for p in pairs if p.reference.location), None),
            captured=any(s.captured for s, _ in observed), numel=site.numel,
            num_steps_seen=len(observed), keep_rate=keep_rate, expected_keep_rate=expected,
            keep_rate_sigmas=_sigmas(keep_rate, expected, sum(s.numel for s, _ in observed)),
            num_steps_compared=len(pairs), num_steps_identical=sum(not differs(p) for p in pairs),
            replay_steps=tuple(step for step, _ in replays), repeats_across_replays=repeats,
            reference_changes=changes))
    return out


def _sigmas(rate: float | None, expected: float | None, num_draws: int) -> float | None:
    if rate is None or expected is None or not math.isfinite(rate):
        return None
    sigma = math.sqrt(max(expected * (1.0 - expected), 0.0) / num_draws)
    off = abs(rate - expected)
    return off / sigma if sigma > 0 else (math.inf if off > 1e-12 else 0.0)


def _differs(ref: Stats, graphed: Stats, exact: bool, rtol: float, atol: float) -> bool:
    exact = exact or (rtol == 0.0 and atol == 0.0)
    for b, a in zip(ref, graphed, strict=True):
        if _same(a, b):
            continue
        if exact or not (math.isfinite(a) and math.isfinite(b)) or abs(a - b) > atol + rtol * abs(b):
            return True
    return False


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _all_same(values: Sequence[Stats]) -> bool:
    return all(_same(a, b) for v in values[1:] for a, b in zip(v, values[0], strict=True))


def _sizes(ref: Stats, graphed: Stats) -> tuple[float, float]:
    """(max abs, max rel) difference over the statistics; NaN where exactly one side is NaN."""
    max_abs = max_rel = 0.0
    for a, b in zip(ref, graphed, strict=True):
        if _same(a, b):
            continue
        if math.isnan(a) or math.isnan(b):
            return math.nan, math.nan
        diff = abs(a - b)
        max_abs = max(max_abs, diff)
        max_rel = max(max_rel, diff / max(abs(a), abs(b)) if math.isfinite(diff) else diff)
    return max_abs, max_rel


__all__ = [
    "ANOMALY_SIGMAS", "DRAW_KINDS", "FORMAT_VERSION", "PHASES", "VALUE_KINDS", "Forensics", "ForensicsError",
    "FrozenDraw", "Site", "SiteSummary", "SkippedStep", "Stats", "StepRows", "TapDivergence",
    "TapRow", "TapTable", "analyze", "forensics_unavailable",
]
