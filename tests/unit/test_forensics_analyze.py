"""compare.forensics and report.forensics on tap tables built from real (CPU) tensors and fingerprints."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from graphdoctor.compare import fingerprint as fp
from graphdoctor.compare.forensics import (
    DRAW_KINDS,
    VALUE_KINDS,
    ForensicsError,
    TapTable,
    analyze,
    forensics_unavailable,
)
from graphdoctor.report.forensics import forensics_table

NUMEL = 4096
P = 0.1
LAYERS = ("decoder.layers.0", "decoder.layers.1")
Tap = tuple[str, str, torch.Tensor]  # kind, module, tensor


def model_taps(seed: int, *, keep: float = 1.0 - P, bump: dict[str, float] | None = None) -> list[Tap]:
    """One training step of a two-layer toy: per layer a dropout mask and an output, then the grads."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(NUMEL, generator=torch.Generator().manual_seed(1234))
    taps: list[Tap] = []
    for layer in LAYERS:
        mask = torch.rand(NUMEL, generator=gen) < keep
        taps.append(("dropout", f"{layer}.dropout", mask))
        x = torch.tanh(x * mask / keep)
        taps.append(("output", layer, x + (bump or {}).get(layer, 0.0)))
    taps += [("grad", layer, 1.0 - x * x) for layer in reversed(LAYERS)]
    return taps


def build(steps: Sequence[tuple[int, str, Sequence[Tap]]], *, slot_base: int = 0) -> dict[str, Any]:
    """A version-1 `forensics` dict: one site per (kind, module, occurrence, eager-or-captured)."""
    slots: dict[tuple[str, str, int, bool], int] = {}
    sites: list[dict[str, Any]] = []
    out_steps = []
    seq = 0
    for step, phase, taps in steps:
        captured = phase in ("capture", "replay")
        counts: dict[tuple[str, str], int] = {}
        rows = []
        for kind, module, tensor in taps:
            occurrence = counts.get((kind, module), 0)
            counts[(kind, module)] = occurrence + 1
            key = (kind, module, occurrence, captured)
            if key not in slots:
                slots[key] = slot_base + len(slots)
                sites.append({"slot": slots[key], "kind": kind, "module": module,
                              "op": "aten.native_dropout" if kind == "dropout" else "forward",
                              "location": f"megatron/core/model.py:{100 + len(slots)}"
                              if kind in DRAW_KINDS else None,
                              "numel": tensor.numel(), "p": P if kind == "dropout" else None,
                              "captured": captured})
            rows.append([slots[key], seq, *fp.fingerprint(tensor, kind).tolist()])
            seq += 1
        out_steps.append({"step": step, "phase": phase, "rows": rows})
    return {"version": 1, "capacity": 4096, "num_slots": len(sites), "truncated": False,
            "sites": sites, "steps": out_steps}


def eager(seeds: Sequence[int], **kwargs: Any) -> dict[str, Any]:
    return build([(i, "eager", model_taps(s, **kwargs)) for i, s in enumerate(seeds)])


def graphed(seeds: Sequence[int], **kwargs: Any) -> dict[str, Any]:
    """Local-style phases: step 0 captures (after one warmup pass: twice the rows), later steps replay."""
    steps = [(0, "capture", model_taps(seeds[0], **kwargs) * 2)]
    steps += [(i, "replay", model_taps(s, **kwargs)) for i, s in enumerate(seeds) if i > 0]
    return build(steps, slot_base=100)


def test_kinds_mirror_fingerprint() -> None:
    assert (DRAW_KINDS, VALUE_KINDS) == (fp.DRAW_KINDS, fp.VALUE_KINDS)


def test_identical_runs_match() -> None:
    f = analyze(eager([0, 1, 2, 3]), graphed([0, 1, 2, 3]), dropout=P)
    assert f.first_divergence is None and f.first_numeric_divergence is None
    assert f.first_draw_mismatch is None
    assert f.rng_aligned is True
    assert f.frozen == ()
    assert f.num_unpaired == 0
    assert f.compared_steps == (1, 2, 3)
    assert len(f.sites) == 6
    assert all(s.num_steps_identical == s.num_steps_compared == 3 for s in f.sites)
    drop = next(s for s in f.sites if s.kind == "dropout")
    assert drop.captured and drop.expected_keep_rate == pytest.approx(0.9)
    assert drop.keep_rate == pytest.approx(0.9, abs=0.03)
    assert not drop.repeats_across_replays and drop.reference_changes
    assert f.keep_rate_anomalies == ()


def test_capture_step_skipped_and_one_sided_steps() -> None:
    f = analyze(eager([0, 1, 2, 3, 4]), graphed([0, 1, 2, 3]), dropout=P)
    reasons = {s.step: s.reason for s in f.skipped_steps}
    assert "capture" in reasons[0]
    assert "only in the reference" in reasons[4]
    assert f.compared_steps == (1, 2, 3)
    assert f.num_unpaired == 0


def test_shifted_rng_is_a_draw_mismatch_not_frozen() -> None:
    f = analyze(eager([0, 1, 2, 3]), graphed([0, 11, 12, 13]), dropout=P)
    assert f.rng_aligned is False
    mismatch = f.first_draw_mismatch
    assert mismatch is not None
    assert (mismatch.step, mismatch.kind, mismatch.module) == (1, "dropout", "decoder.layers.0.dropout")
    assert mismatch.location is not None and mismatch.location.startswith("megatron/core/model.py:")
    assert mismatch.max_abs > 0
    assert f.first_divergence == mismatch
    assert f.first_numeric_divergence is None
    assert f.frozen == ()


def test_frozen_draws_found() -> None:
    f = analyze(eager([0, 1, 2, 3]), graphed([1, 1, 1, 1]), dropout=P)
    assert {fr.module for fr in f.frozen} == {f"{layer}.dropout" for layer in LAYERS}
    assert all(fr.first_step == 1 and fr.num_replay_steps == 3 and fr.kind == "dropout" for fr in f.frozen)
    assert f.frozen[0].location is not None
    assert f.rng_aligned is False
    assert f.first_draw_mismatch is not None and f.first_draw_mismatch.step == 2
    # step 1 happens to draw the captured mask, so its outputs match: no numeric divergence
    assert f.first_numeric_divergence is None
    drop = next(s for s in f.sites if s.module == "decoder.layers.0.dropout")
    assert drop.repeats_across_replays and drop.reference_changes and drop.num_steps_identical == 1


def test_numeric_divergence_in_reference_execution_order() -> None:
    reference = eager([0, 1, 2, 3])
    bumped = {"decoder.layers.0": 0.5, "decoder.layers.1": 2.0}
    steps: list[tuple[int, str, Sequence[Tap]]] = [(0, "capture", model_taps(0) * 2)]
    for i in (1, 2, 3):
        # the graphed run writes layer 1's output before layer 0's: the reference order must win
        taps = model_taps(i, bump=bumped if i >= 2 else None)
        steps.append((i, "replay", [taps[3], taps[2], *taps[:2], *taps[4:]]))
    f = analyze(reference, build(steps, slot_base=7), dropout=P)
    assert f.rng_aligned is True
    num = f.first_numeric_divergence
    assert num is not None
    assert (num.step, num.kind, num.module) == (2, "output", "decoder.layers.0")
    assert num.max_abs == pytest.approx(0.5 * NUMEL, rel=1e-3)
    assert num.max_rel > 0
    assert f.first_divergence == num
    assert f.first_draw_mismatch is None


def test_numeric_divergence_ignored_after_a_draw_mismatch() -> None:
    bump = {"decoder.layers.1": 1.0}
    graphed_steps = [(0, "capture", model_taps(0)), (1, "replay", model_taps(1)),
                     (2, "replay", model_taps(22)), (3, "replay", model_taps(3, bump=bump))]
    f = analyze(eager([0, 1, 2, 3]), build(graphed_steps), dropout=P)
    assert f.first_draw_mismatch is not None and f.first_draw_mismatch.step == 2
    assert f.first_numeric_divergence is None


def test_unpaired_extras_counted() -> None:
    steps: list[tuple[int, str, Sequence[Tap]]] = [(0, "capture", model_taps(0))]
    extra = torch.rand(64, generator=torch.Generator().manual_seed(5))
    for i in (1, 2, 3):
        steps.append((i, "replay", [*model_taps(i), ("random", "decoder.layers.1.router", extra)]))
    f = analyze(eager([0, 1, 2, 3]), build(steps), dropout=P)
    assert f.num_unpaired == 3
    assert f.first_divergence is None and f.rng_aligned is True
    router = next(s for s in f.sites if s.kind == "random")
    assert router.num_steps_compared == 0 and router.num_steps_seen == 3


def test_tolerance_applies_to_values_not_draws() -> None:
    small = {"decoder.layers.1": 1e-6}
    reference = eager([0, 1, 2, 3])
    assert analyze(reference, graphed([0, 1, 2, 3], bump=small), dropout=P).first_divergence is not None
    f = analyze(reference, graphed([0, 1, 2, 3], bump=small), dropout=P, rtol=1e-3, atol=1e-2)
    assert f.first_divergence is None
    assert all(s.num_steps_identical == s.num_steps_compared for s in f.sites)
    shifted = analyze(reference, graphed([0, 11, 12, 13]), dropout=P, rtol=1.0, atol=1e6)
    assert shifted.first_draw_mismatch is not None and shifted.rng_aligned is False


def test_keep_rate_anomaly() -> None:
    f = analyze(eager([0, 1, 2, 3], keep=0.5), graphed([0, 1, 2, 3], keep=0.5), dropout=P)
    assert {s.module for s in f.keep_rate_anomalies} == {f"{layer}.dropout" for layer in LAYERS}
    anomaly = f.keep_rate_anomalies[0]
    assert anomaly.keep_rate == pytest.approx(0.5, abs=0.03)
    assert anomaly.expected_keep_rate == pytest.approx(0.9)
    assert anomaly.keep_rate_sigmas is not None and anomaly.keep_rate_sigmas > 6


def test_missing_p_uses_configured_dropout() -> None:
    data = graphed([0, 1, 2, 3])
    for site in data["sites"]:
        site["p"] = None
    f = analyze(eager([0, 1, 2, 3]), data, dropout=0.5)
    assert {s.module for s in f.keep_rate_anomalies} == {f"{layer}.dropout" for layer in LAYERS}


def test_non_finite_values_as_strings() -> None:
    reference, data = eager([0, 1, 2]), graphed([0, 1, 2])
    for side, nan in ((reference, "nan"), (data, math.nan)):
        for step in side["steps"]:
            for row in step["rows"]:
                if side["sites"][row[0] - (100 if side is data else 0)]["kind"] == "output":
                    row[2:] = [nan, "inf", "-inf"] if isinstance(nan, str) else [nan, math.inf, -math.inf]
    f = analyze(reference, data, dropout=P)
    assert f.first_divergence is None
    data["steps"][1]["rows"][1][3] = 1.0  # layer 0 output of step 1: l2 inf -> 1.0
    f = analyze(reference, data, dropout=P)
    div = f.first_divergence
    assert div is not None and div.module == "decoder.layers.0" and div.graphed[1] == 1.0
    assert math.isinf(div.max_abs)
    payload = json.loads(json.dumps(f.to_dict(), allow_nan=False))
    assert payload["first_divergence"]["reference"] == ["nan", "inf", "-inf"]
    assert payload["first_divergence"]["max_abs"] == "inf"


def test_to_dict_is_strict_json() -> None:
    f = analyze(eager([0, 1, 2, 3]), graphed([1, 1, 1, 1]), dropout=P)
    payload = json.loads(json.dumps(f.to_dict(), allow_nan=False))
    assert payload["version"] == 1
    assert set(payload) >= {"sites", "frozen", "first_divergence", "first_numeric_divergence",
                            "first_draw_mismatch", "rng_aligned", "keep_rate_anomalies", "num_unpaired",
                            "skipped_steps", "notes", "compared_steps"}
    assert payload["frozen"][0]["module"] == "decoder.layers.0.dropout"
    assert payload["skipped_steps"] == [{"step": 0, "reason": f.skipped_steps[0].reason}]


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d.pop("sites"), "sites"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d["steps"][1]["rows"][0].pop(), "rows[0]"),
    (lambda d: d["steps"][1]["rows"][0].__setitem__(2, "lots"), "rows[0][2]"),
    (lambda d: d["steps"][1]["rows"][0].__setitem__(0, 999), "999"),
    (lambda d: d["steps"][1].update(phase="graphed"), "phase"),
    (lambda d: d["sites"][0].update(kind="noise"), "kind"),
    (lambda d: d["sites"][0].update(captured="yes"), "captured"),
    (lambda d: d["sites"][1].update(slot=d["sites"][0]["slot"]), "duplicate"),
    (lambda d: d.update(steps={}), "steps"),
])
def test_bad_shape_raises(mutate: Any, field: str) -> None:
    data = copy.deepcopy(graphed([0, 1]))
    mutate(data)
    with pytest.raises(ValueError, match="expected") as info:
        analyze(eager([0, 1]), data, dropout=P)
    assert field in str(info.value)
    assert "graphed.forensics" in str(info.value)


def test_unavailable_sides() -> None:
    reference = eager([0, 1])
    failed = {"version": 1, "capacity": 4096, "num_slots": 0, "truncated": False, "sites": [],
              "steps": [], "error": "RuntimeError: cannot tap"}
    assert forensics_unavailable(reference, reference) is None
    assert "graphed" in (forensics_unavailable(reference, None) or "")
    with pytest.raises(ForensicsError, match="cannot tap"):
        analyze(reference, failed, dropout=P)
    with pytest.raises(ValueError, match="reference run reported no forensics"):
        analyze(None, reference, dropout=P)


def test_partial_error_and_truncation_become_notes() -> None:
    data = graphed([0, 1, 2])
    data.update(error="tap on decoder.layers.1 failed", truncated=True)
    f = analyze(eager([0, 1, 2]), data, dropout=P)
    assert any("decoder.layers.1 failed" in n for n in f.notes)
    assert any("truncated at 4096" in n for n in f.notes)


def test_table_small_lists_every_site() -> None:
    f = analyze(eager([0, 1, 2, 3]), graphed([1, 1, 1, 1]), dropout=P)
    text = forensics_table(f)
    for name in ("decoder.layers.0.dropout", "decoder.layers.1.dropout", "decoder.layers.1"):
        assert name in text
    assert "frozen RNG: decoder.layers.0.dropout" in text
    assert "first draw mismatch: step 2 dropout decoder.layers.0.dropout" in text
    assert "RNG: not aligned" in text
    assert "keep rate (expected)" in text
    assert "output/grad sites" not in text


def test_table_collapses_value_sites_when_large() -> None:
    def taps(seed: int) -> list[Tap]:
        mask = torch.rand(NUMEL, generator=torch.Generator().manual_seed(seed)) < 1 - P
        out: list[Tap] = [("dropout", "decoder.layers.0.dropout", mask)]
        return out + [("output", f"decoder.layers.{i}", mask * float(i)) for i in range(20)]

    reference = build([(i, "eager", taps(i)) for i in range(3)])
    graphed_run = build([(0, "capture", taps(0)), *[(i, "replay", taps(i)) for i in (1, 2)]])
    text = forensics_table(analyze(reference, graphed_run, dropout=P))
    assert "decoder.layers.0.dropout" in text
    assert "decoder.layers.13 " not in text
    assert "+ 20 output/grad sites (20 identical on every compared step)" in text
    assert "first divergence: none" in text
    assert "RNG: aligned" in text


def test_tap_table_parses_rows_in_seq_order() -> None:
    data = eager([0])
    rows = data["steps"][0]["rows"]
    rows.reverse()
    rows[0][2:] = ["NaN", "+inf", "-Infinity"]
    table = TapTable.from_dict(data)
    parsed = table.steps[0].rows
    assert [r.seq for r in parsed] == sorted(r[1] for r in rows)
    assert math.isnan(parsed[-1].stats[0]) and parsed[-1].stats[1:] == (math.inf, -math.inf)
    assert table.sites[0].kind == "dropout" and table.sites[0].p == P and not table.sites[0].captured


def test_capture_step_without_warmup_rows_is_compared() -> None:
    # transformer_engine: graph creation's warmups run without module hooks, so the capture step
    # has at most the reference's rows, and a difference there is the first one.
    seeds = [11, 12, 13]
    ref = eager(seeds)
    steps = [(0, "warmup", model_taps(seeds[0])),
             (1, "capture", model_taps(seeds[1], bump={"decoder.layers.1": 0.5})),
             (2, "replay", model_taps(seeds[2], bump={"decoder.layers.1": 0.5}))]
    found = analyze(ref, build(steps), dropout=P)
    assert found.skipped_steps == ()
    div = found.first_numeric_divergence
    assert div is not None and (div.step, div.phase, div.module) == (1, "capture", "decoder.layers.1")


def test_te_numeric_diagnosis_says_graphed_modules_are_not_tapped() -> None:
    from graphdoctor.compare.rng_verdict import apply_forensics
    from graphdoctor.compare.verdict import ImplResult
    from graphdoctor.types import Verdict

    seeds = [11, 12, 13]
    steps = [(i, "eager" if i == 0 else "replay", model_taps(s, bump={"decoder.layers.1": 0.5}))
             for i, s in enumerate(seeds)]
    found = analyze(eager(seeds), build(steps), dropout=P)
    for impl, hint in (("transformer_engine", True), ("full_iteration", False)):
        result = apply_forensics(ImplResult(impl=impl, verdict=Verdict.NUMERIC_DIVERGENCE), found,
                                 aligned_requested=False)
        assert result.diagnosis is not None and result.diagnosis.module == "decoder.layers.1"
        assert ("not tapped" in result.diagnosis.message) is hint
        assert ("--cuda-graph-modules" in (result.diagnosis.fix or "")) is hint
