"""The causes of the planted divergences, re-derived on the CPU from diff reports recorded on the H200
(fixtures/data/causes/, written by tests/gpu/test_causes_gpu.py): the graphed run's evidence (its hazards)
and the row's divergence give the same rule, module and marked line again; the clean model gives none."""

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

PLANTED = [  # (recording, implementation, rule, fixture, marker)
    ("rebound_gain", "local", "GD509", "cause_rebound_gain", "GD509"),
    ("host_temperature", "local", "GD518", "cause_host_temperature", "GD518"),
    ("capture_branch", "local", "GD519", "cause_capture_branch", "GD519"),
    ("kept_activation", "local", "GD520", "cause_kept_activation", "GD520"),
    ("kept_backward", "local", "GD520", "cause_kept_backward", "GD520"),
    ("eval_grad_mode", "local", "GD402", "cause_eval_grad_mode", "GD402"),
    ("frozen_fill", "full_iteration", "GD513", "cause_frozen_fill", "GD513"),
]


def _report(name: str) -> DiffReport:
    with gzip.open(DATA / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
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
