"""Forensics on tap tables recorded on the H200 (fixtures/data/forensics/): offline analysis on the
CPU gives what the live diff reported, and the recorded tables show the physical effects."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from graphdoctor.compare.forensics import analyze
from graphdoctor.report.forensics import forensics_table
from tests.unit.recorded import as_recorded

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "forensics"


def _load(name: str) -> dict[str, Any]:
    with gzip.open(DATA / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        return json.load(fh)  # type: ignore[no-any-return]


def test_local_dropout_pair_offline_analysis_equals_the_live_one() -> None:
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
    assert doc["live_verdict"] == "frozen-rng"
    assert doc["live_diagnosis"]["module"] == "decoder.layers.0.mlp"
    assert [f["module"] for f in doc["live_analysis"]["frozen"]] == sorted(rows)


def test_recorded_reassigned_scale_keeps_the_captured_scale() -> None:
    doc = _load("h200_numeric_reassigned_scale")
    live = doc["live_analysis"]["first_numeric_divergence"]
    assert (live["step"], live["module"], live["kind"]) == (1, "decoder.layers.0.mlp", "output")
    assert live["max_rel"] > 1e-4
    assert doc["live_analysis"]["first_draw_mismatch"] is None
    assert doc["live_verdict"] == "numeric-divergence"


def test_apply_forensics_on_the_recorded_pair_names_the_draw_and_the_rule() -> None:
    from graphdoctor.compare.rng_verdict import apply_forensics
    from graphdoctor.compare.verdict import ImplResult
    from graphdoctor.types import Verdict

    doc = _load("h200_local_dropout_te_spec")
    found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
    result = apply_forensics(ImplResult(impl="local", verdict=Verdict.RNG_DIVERGENCE), found,
                             aligned_requested=False)
    assert result.verdict == Verdict.RNG_DIVERGENCE
    assert result.forensics is not None and as_recorded(result.forensics.to_dict(), doc["live_analysis"]) == doc["live_analysis"]
    assert any("embedding.embedding_dropout" in n and "GD401" in n for n in result.notes)
    assert "RNG: not aligned" in forensics_table(result.forensics)



def test_recorded_planted_pairs_offline_analysis_equals_the_live_one() -> None:
    for name in ("h200_frozen_host_mask", "h200_numeric_reassigned_scale", "h200_clean_dropout_aligned"):
        doc = _load(name)
        found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
        assert as_recorded(found.to_dict(), doc["live_analysis"]) == doc["live_analysis"], name


def test_recorded_aligned_pair_has_every_draw_equal_and_every_graph_stamped() -> None:
    doc = _load("h200_clean_dropout_aligned")
    found = analyze(doc["reference"], doc["graphed"], dropout=doc["dropout"])
    assert doc["live_verdict"] == "match"
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
