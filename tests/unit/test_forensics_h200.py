"""Forensics on tap tables recorded on the H200 (fixtures/data/forensics/): the first differing tap, draw and
value derived row by row from the raw tap tables in this file and held against analyze(); the verdict and
diagnosis derived again with apply_forensics against what the live diff reported; and snapshots of the live
analysis documents."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.compare.forensics import TapDivergence, analyze
from graphdoctor.compare.rng_verdict import apply_forensics
from graphdoctor.compare.verdict import ImplResult
from graphdoctor.report.forensics import forensics_table
from graphdoctor.types import Verdict
from tests.unit.recorded import as_recorded

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "forensics"
RECORDED = ("h200_clean_dropout_aligned", "h200_frozen_host_mask", "h200_local_dropout_te_spec",
            "h200_numeric_reassigned_scale", "h200_te_attn_scope")
DRAWS = ("dropout", "random", "host-random")
VALUES = ("output", "grad", "input-grad")

Key = tuple[str, str, str, int]
"""(kind, module, op, k-th time this kind/module/op wrote in the step)."""
Pair = tuple[int, Key, tuple[float, ...], tuple[float, ...]]
"""(step, key, reference statistics, graphed statistics)."""


def _load(name: str) -> dict[str, Any]:
    with gzip.open(DATA / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        return json.load(fh)  # type: ignore[no-any-return]


def _raw_rows(table: dict[str, Any], entry: dict[str, Any]) -> dict[Key, tuple[float, ...]]:
    """One step's rows `[slot, seq, s0, s1, s2]` by key, in execution (seq) order."""
    sites = {s["slot"]: s for s in table["sites"]}
    out: dict[Key, tuple[float, ...]] = {}
    for slot, _seq, *stats in sorted(entry["rows"], key=lambda r: r[1]):
        site = sites[slot]
        base = (site["kind"], site["module"] or "", site["op"])
        occurrence = sum(1 for key in out if key[:3] == base)
        out[(*base, occurrence)] = tuple(float(v) for v in stats)
    return out


def _raw_pairs(doc: dict[str, Any]) -> tuple[list[int], list[Pair]]:
    """The steps both runs wrote and every tap written in both, steps ascending and in the reference's
    execution order within a step. A graphed capture step whose warmup passes wrote taps eager has no
    counterpart for is left out (those extra rows shift every later occurrence)."""
    reference = {e["step"]: e for e in doc["reference"]["steps"]}
    steps: list[int] = []
    pairs: list[Pair] = []
    for entry in sorted(doc["graphed"]["steps"], key=lambda e: e["step"]):
        if entry["step"] not in reference:
            continue
        ref, graphed = _raw_rows(doc["reference"], reference[entry["step"]]), _raw_rows(doc["graphed"], entry)
        if entry["phase"] == "capture" and not graphed.keys() <= ref.keys():
            continue
        steps.append(entry["step"])
        pairs += [(entry["step"], key, ref[key], graphed[key]) for key in ref if key in graphed]
    return steps, pairs


def _differs(pair: Pair) -> bool:
    return any(a != b and not (math.isnan(a) and math.isnan(b)) for a, b in zip(pair[2], pair[3], strict=True))


def _raw_firsts(doc: dict[str, Any]) -> tuple[Pair | None, Pair | None, Pair | None]:
    """First differing tap, first differing draw, and first differing output/gradient in a step before the
    first differing draw (bitwise, as the recordings were compared)."""
    differing = [p for p in _raw_pairs(doc)[1] if _differs(p)]
    draw = next((p for p in differing if p[1][0] in DRAWS), None)
    value = next((p for p in differing if p[1][0] in VALUES and (draw is None or p[0] < draw[0])), None)
    return (differing[0] if differing else None), draw, value


def _as_pair(div: TapDivergence | None) -> Pair | None:
    if div is None:
        return None
    return div.step, (div.kind, div.module, div.op, div.occurrence), div.reference, div.graphed


@pytest.mark.parametrize("name", RECORDED)
def test_analysis_equals_a_row_by_row_comparison_of_the_raw_tap_tables(name: str) -> None:
    doc = _load(name)
    found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
    steps, pairs = _raw_pairs(doc)
    first, draw, value = _raw_firsts(doc)
    assert list(found.compared_steps) == steps
    assert _as_pair(found.first_divergence) == first
    assert _as_pair(found.first_draw_mismatch) == draw
    assert _as_pair(found.first_numeric_divergence) == value
    assert found.rng_aligned == (None if not any(p[1][0] in DRAWS for p in pairs) else draw is None)


def test_raw_tap_tables_differ_where_each_recording_says() -> None:
    """The raw comparison is not vacuous: each planted pair differs at its own module, kind and step."""
    where = {}
    for name in RECORDED:
        first = _raw_firsts(_load(name))[0]
        where[name] = None if first is None else (first[0], first[1][1], first[1][0])
    assert where == {
        "h200_clean_dropout_aligned": None,
        "h200_frozen_host_mask": (1, "decoder.layers.0.mlp", "host-random"),
        "h200_local_dropout_te_spec": (1, "embedding.embedding_dropout", "dropout"),
        "h200_numeric_reassigned_scale": (1, "decoder.layers.0.mlp", "output"),
        "h200_te_attn_scope": (2, "decoder.layers.0.mlp", "output"),
    }


def test_local_dropout_pair_analysis_snapshot_equals_the_live_one() -> None:
    """Snapshot (regression) of the live analysis, which the same analyze() wrote on the H200; the
    independent check is the raw row-by-row comparison above."""
    doc = _load("h200_local_dropout_te_spec")
    found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
    assert as_recorded(found.to_dict(), doc["live_analysis"]) == doc["live_analysis"]
    assert found.frozen == ()
    assert found.rng_aligned is False
    mismatch = found.first_draw_mismatch
    assert mismatch is not None
    assert (mismatch.step, mismatch.module, mismatch.kind) == (1, "embedding.embedding_dropout",
                                                                "dropout")
    # Same keep count, different positions: a shifted Philox offset, not a different rate.
    assert mismatch.reference[0] == mismatch.graphed[0]
    assert mismatch.reference[1:] != mismatch.graphed[1:]
    assert found.keep_rate_anomalies == ()
    table = forensics_table(found)
    assert "embedding.embedding_dropout" in table


def _rows_by_module(table: dict[str, Any], kind: str) -> dict[str, dict[int, list[float]]]:
    sites = {s["slot"]: s for s in table["sites"]}
    out: dict[str, dict[int, list[float]]] = {}
    for entry in table["steps"]:
        for row in entry["rows"]:
            site = sites[row[0]]
            if site["kind"] == kind and site["captured"]:
                out.setdefault(site["module"], {})[entry["step"]] = row[2:]
    return out


def test_recorded_host_mask_replays_one_mask_in_every_step() -> None:
    doc = _load("h200_frozen_host_mask")
    rows = _rows_by_module(doc["graphed"], "host-random")
    assert set(rows) == {"decoder.layers.0.mlp", "decoder.layers.1.mlp"}
    for steps in rows.values():
        replays = [steps[s] for s in sorted(steps)]
        assert len(replays) >= 4
        assert all(r == replays[0] for r in replays)
    reference = {e["step"]: _raw_rows(doc["reference"], e) for e in doc["reference"]["steps"]}
    for module in rows:  # eager draws new values every step
        drawn = [rows_of_step[("host-random", module, "aten._to_copy", 0)] for rows_of_step in reference.values()]
        assert len(set(drawn)) == len(drawn), module
    found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
    assert [f.module for f in found.frozen] == sorted(rows)
    assert all(f.first_step == 1 and f.num_replay_steps == 5 for f in found.frozen)
    # the row as judged before the forensics (dropout 0: numeric-divergence), sharpened as the live diff did
    result = apply_forensics(ImplResult(impl="local", verdict=Verdict.NUMERIC_DIVERGENCE), found,
                             aligned_requested=False)
    assert result.verdict.value == doc["live_verdict"] == "frozen-rng"
    assert result.diagnosis is not None and result.diagnosis.module == "decoder.layers.0.mlp"
    # the catalogue's GD506 fix was reworded after the recording; everything else is as the live diff said
    recorded = {k: v for k, v in doc["live_diagnosis"].items() if k != "fix"}
    assert as_recorded(result.diagnosis.to_dict(), recorded) == recorded


def test_recorded_reassigned_scale_keeps_the_captured_scale() -> None:
    doc = _load("h200_numeric_reassigned_scale")
    _, draw, value = _raw_firsts(doc)
    assert draw is None and value is not None
    step, (kind, module, _, _), ref, graphed = value
    assert (step, module, kind) == (1, "decoder.layers.0.mlp", "output")
    raw_rel = max(abs(a - b) / max(abs(a), abs(b)) for a, b in zip(ref, graphed, strict=True) if a != b)
    found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
    div = found.first_numeric_divergence
    assert div is not None and (div.step, div.module, div.kind) == (1, "decoder.layers.0.mlp", "output")
    assert div.max_rel == pytest.approx(raw_rel) and div.max_rel > 1e-4
    assert found.first_draw_mismatch is None
    result = apply_forensics(ImplResult(impl="local", verdict=Verdict.NUMERIC_DIVERGENCE), found,
                             aligned_requested=False)
    assert result.verdict.value == doc["live_verdict"] == "numeric-divergence"
    assert result.diagnosis is not None
    assert as_recorded(result.diagnosis.to_dict(), doc["live_diagnosis"]) == doc["live_diagnosis"]


def test_apply_forensics_on_the_recorded_pair_names_the_draw_and_the_rule() -> None:
    doc = _load("h200_local_dropout_te_spec")
    found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
    result = apply_forensics(ImplResult(impl="local", verdict=Verdict.RNG_DIVERGENCE), found,
                             aligned_requested=False)
    assert result.verdict == Verdict.RNG_DIVERGENCE
    assert result.forensics is not None and as_recorded(result.forensics.to_dict(), doc["live_analysis"]) == doc["live_analysis"]
    assert any("embedding.embedding_dropout" in n and "GD401" in n for n in result.notes)
    assert "RNG: not aligned" in forensics_table(result.forensics)


def test_recorded_planted_pairs_analysis_snapshot_equals_the_live_one() -> None:
    """Snapshot (regression) of the live analyses; the independent check is the raw row-by-row comparison."""
    for name in ("h200_frozen_host_mask", "h200_numeric_reassigned_scale", "h200_clean_dropout_aligned"):
        doc = _load(name)
        found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
        assert as_recorded(found.to_dict(), doc["live_analysis"]) == doc["live_analysis"], name


def test_recorded_aligned_pair_has_every_draw_equal_and_every_graph_stamped() -> None:
    doc = _load("h200_clean_dropout_aligned")
    found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
    result = apply_forensics(ImplResult(impl="local", verdict=Verdict.MATCH), found, aligned_requested=True)
    assert result.verdict.value == doc["live_verdict"] == "match"
    assert "every dropout mask and random draw is identical to eager (with --align-rng)" in result.notes
    assert found.rng_aligned is True
    assert found.first_divergence is None and found.frozen == ()
    graphed = doc["graphed"]
    captured = {s["slot"] for s in graphed["sites"] if s["captured"]}
    dropouts = {s["slot"] for s in graphed["sites"] if s["captured"] and s["kind"] == "dropout"}
    assert dropouts
    # Replay steps report every captured tap (each graph stamped its step), the capture step none.
    for entry in graphed["steps"]:
        written = {r[0] for r in entry["rows"]} & captured
        assert written == (set() if entry["phase"] == "capture" else captured), entry["step"]


def test_te_attention_graphs_first_difference_is_at_the_capture_step_after_attention() -> None:
    # TE graphs only attention here; their modules are not tapped. The loss differs from step 2
    # (the capture step), and the first tapped module after the graphed attention is the eager MLP.
    doc = _load("h200_te_attn_scope")
    assert doc["live_verdict"] == "numeric-divergence"
    assert doc["live_first_divergence"]["step"] == 2
    found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
    assert found.skipped_steps == ()
    div = found.first_numeric_divergence
    assert div is not None
    assert (div.step, div.phase, div.module, div.kind) == (2, "capture", "decoder.layers.0.mlp", "output")
    sites = {s["slot"]: s["module"] for s in doc["graphed"]["sites"]}
    for entry in doc["graphed"]["steps"]:
        tapped = {sites[r[0]] for r in entry["rows"]}
        # eager warmups tap the attention; once TE's graphs run it, its hooks never fire
        assert ("decoder.layers.0.self_attention" in tapped) is (entry["step"] < 2), entry["step"]
