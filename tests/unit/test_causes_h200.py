"""The causes of the planted divergences, re-derived on the CPU from diff reports recorded on the H200
(fixtures/data/causes/, written by tests/gpu/test_causes_gpu.py; fixtures/data/holders/, by
tests/gpu/test_holders_gpu.py): the graphed run's evidence (its hazards) and the row's divergence give the same
rule, module, marked line and holder again; the clean model gives none."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from fixtures.planted.markers import marked_location
from graphdoctor.compare.causes import HOOK, apply_causes, grouped, related
from graphdoctor.compare.verdict import ImplResult
from graphdoctor.diff import DiffReport
from graphdoctor.report.diff import render_text
from graphdoctor.report.html import render_payload
from graphdoctor.types import Verdict

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "causes"
HOLDERS = DATA.parent / "holders"

PLANTED = [  # (recording, implementation, rule, fixture, marker)
    ("rebound_gain", "local", "GD509", "cause_rebound_gain", "GD509"),
    ("host_temperature", "local", "GD518", "cause_host_temperature", "GD518"),
    ("capture_branch", "local", "GD519", "cause_capture_branch", "GD519"),
    ("kept_activation", "local", "GD520", "cause_kept_activation", "GD520"),
    ("kept_backward", "local", "GD520", "cause_kept_backward", "GD520"),
    ("eval_grad_mode", "local", "GD402", "cause_eval_grad_mode", "GD402"),
    ("frozen_fill", "full_iteration", "GD513", "cause_frozen_fill", "GD513"),
]


def _report(name: str, where: Path = DATA) -> DiffReport:
    with gzip.open(where / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        return DiffReport.from_dict(json.load(fh))


def _row(report: DiffReport, impl: str) -> ImplResult:
    return next(r for r in report.results if r.impl == impl)


def _before_causes(row: ImplResult) -> ImplResult:
    """The row as diff judged it before naming causes: no causes, none of their notes, the taps' diagnosis."""
    lines = {c.line() for c in row.causes} | {f"{c.line()} [seen, no difference measured in this run]" for c in row.causes}
    notes = tuple(n for n in row.notes if n not in lines and not n.startswith("backward: "))
    return dataclasses.replace(row, causes=(), notes=notes, diagnosis=None)


@pytest.mark.parametrize(("name", "impl", "rule", "fixture", "marker"), PLANTED, ids=[p[0] for p in PLANTED])
def test_recorded_cause_is_named_again_from_the_evidence(name: str, impl: str, rule: str, fixture: str,
                                                         marker: str) -> None:
    report = _report(name)
    row = _row(report, impl)
    assert row.verdict == Verdict.NUMERIC_DIVERGENCE
    assert row.diagnosis is not None and row.diagnosis.rule == rule
    assert row.diagnosis.location == marked_location(fixture, marker)
    again = apply_causes(_before_causes(row), row.runs[0])
    assert again.diagnosis is not None
    assert (again.diagnosis.rule, again.diagnosis.location, again.diagnosis.module) == \
        (rule, row.diagnosis.location, row.diagnosis.module)
    assert [c.explains for c in again.causes].count(True) == 1
    text = render_text(report)
    assert f"at: {row.diagnosis.location}" in text and f"[{rule}]" in text
    html = render_payload(report.to_dict())
    assert row.diagnosis.location in html and rule in html


def test_the_clean_recording_has_no_cause_and_no_hook() -> None:
    report = _report("clean_dropout")
    for row in report.results:
        assert row.verdict in (Verdict.MATCH, Verdict.RNG_DIVERGENCE)
        assert row.causes == ()
        evidence = [h for run in row.runs for h in run.hazards if h.rule != HOOK]
        # Megatron's own local runners replay the training graphs in every evaluation: evidence of the run,
        # no cause of a row whose evaluations match (the static GD402 note says it).
        assert all(h.rule == "GD402" and h.location and h.location.startswith("megatron/core/") for h in evidence)
        assert not any(n.startswith("GD514") for n in row.notes), row.notes


def test_same_line_in_every_layer_is_one_cause() -> None:
    row = _row(_report("rebound_gain"), "local")
    evidence = [h for h in row.runs[0].hazards if h.rule == "GD509"]
    assert len(evidence) == 2 and len({h.location for h in evidence}) == 1
    (cause,) = [c for c in row.causes if c.rule == "GD509"]
    assert cause.explains and "the same in decoder.layers.1.mlp" in cause.message
    assert len(grouped(row.causes)) == len(row.causes)


def test_related_modules() -> None:
    assert related("decoder.layers.0.mlp", "decoder.layers.0")
    assert related("decoder.layers.0", "decoder.layers.0.mlp.linear_fc1")
    assert not related("decoder.layers.1.mlp", "decoder.layers.10.mlp")
    assert not related("", "decoder")


HELD = [  # (recording = fixture, rule, the holder's path holds, rows whose graphs read it, verdict there)
    ("holder_param_group", "GD522", "param_groups[0]['aux_weight']", ("full_iteration",), Verdict.NUMERIC_DIVERGENCE),
    ("holder_closure", "GD522", "weighted_loss.<closure>.weight", ("full_iteration",), Verdict.NUMERIC_DIVERGENCE),
    ("holder_global", "GD522", "holder_global.GAIN", ("local", "full_iteration"), Verdict.NUMERIC_DIVERGENCE),
    ("holder_class_number", "GD518", "DampedMLP.damping", ("local", "full_iteration"), Verdict.NUMERIC_DIVERGENCE),
    ("holder_global_number", "GD518", "holder_global_number.Z_WEIGHT", ("full_iteration",),
     Verdict.NUMERIC_DIVERGENCE),
    ("holder_grad_scale", "GD522", "grad_scale_func.<closure>.boost", ("full_iteration",), Verdict.NUMERIC_DIVERGENCE),
    ("holder_rng_reseed", "GD522", "rng_tracker.states_[", ("local", "full_iteration"),
     Verdict.RNG_DIVERGENCE),
]


@pytest.mark.parametrize(("fixture", "rule", "holder", "reads", "verdict"), HELD, ids=[h[0] for h in HELD])
def test_recorded_holder_is_named_again_from_the_evidence(fixture: str, rule: str, holder: str,
                                                          reads: tuple[str, ...], verdict: Verdict) -> None:
    report = _report(fixture, HOLDERS)
    for row in report.results:
        again = apply_causes(_before_causes(row), row.runs[0])
        if row.impl not in reads:
            assert row.verdict == Verdict.MATCH and again.diagnosis is None, (row.impl, row.notes)
            continue
        assert row.verdict == verdict
        assert again.diagnosis is not None and (again.diagnosis.rule, again.diagnosis.location) == \
            (rule, marked_location(fixture, rule)), (row.impl, again.diagnosis)
        (explained,) = [c for c in again.causes if c.explains]
        assert explained.subject is not None and holder in explained.subject, explained
        assert again.diagnosis.error_type == verdict.value  # the cause line is headed by the row's own verdict
        assert not again.passed  # an rng-divergence a cause explains fails too
    assert report.exit_code() == 1


def test_megatron_fp16_scaler_under_full_iteration_is_named_at_its_rebinding_line() -> None:
    report = _report("fp16_dynamic", HOLDERS)
    local, full = (_row(report, impl) for impl in ("local", "full_iteration"))
    assert local.verdict == Verdict.MATCH and local.causes == ()
    again = apply_causes(_before_causes(full), full.runs[0])
    diag = again.diagnosis
    assert diag is not None and (diag.rule, diag.location) == ("GD522", "megatron/core/optimizer/grad_scaler.py:143")
    assert diag.fix is not None and "--loss-scale" in diag.fix and "bf16" in diag.fix
    assert "grad_scaler._scale" in diag.message and "freed" in diag.message


@pytest.mark.parametrize("name", ["fp16_static_4096", "bf16", "clean_dropout"])
def test_static_scale_bf16_and_the_clean_dropout_model_name_no_holder(name: str) -> None:
    report = _report(name, HOLDERS)
    for row in report.results:
        assert row.verdict in (Verdict.MATCH, Verdict.RNG_DIVERGENCE), (row.impl, row.verdict)
        assert not [h for run in row.runs for h in run.hazards if h.rule in ("GD518", "GD522")], row.impl
        assert row.passed
    assert report.exit_code() == 0
