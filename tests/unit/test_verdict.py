"""Verdict logic on child records recorded on the H200 (fixtures/data/diff/*.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.compare.verdict import Timing, find_divergence, judge, steady_timing
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.types import Diagnosis, TensorDiff, Verdict

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def records(report: dict[str, Any], impl: str) -> list[RunRecord]:
    entry = next(i for i in report["impls"] if i["impl"] == impl)
    return [RunRecord.from_dict(r) for r in entry["runs"]]


@pytest.fixture(scope="module")
def dropout_report() -> dict[str, Any]:
    return load("h200_default_dropout0.1.json")


def test_local_with_dropout_is_rng_divergence(dropout_report: dict[str, Any]) -> None:
    reference = RunRecord.from_dict(dropout_report["reference"])
    control_ref = RunRecord.from_dict(dropout_report["control_reference"])
    graphed, control = records(dropout_report, "local")
    assert graphed.dropout > 0 and control.dropout == 0
    result = judge(reference, graphed, warmup_steps=2, control_reference=control_ref,
                   control_graphed=control)
    assert result.verdict == Verdict.RNG_DIVERGENCE
    assert result.control is not None and result.control.verdict == Verdict.MATCH
    assert result.divergence is not None and result.divergence.step == 1
    assert result.divergence.what == "loss"


def test_local_without_control_is_numeric(dropout_report: dict[str, Any]) -> None:
    reference = RunRecord.from_dict(dropout_report["reference"])
    graphed, _ = records(dropout_report, "local")
    result = judge(reference, graphed, warmup_steps=2)
    assert result.verdict == Verdict.NUMERIC_DIVERGENCE
    assert "no dropout-free control pair ran" in result.notes


def test_full_iteration_matches_bitwise(dropout_report: dict[str, Any]) -> None:
    reference = RunRecord.from_dict(dropout_report["reference"])
    (graphed,) = records(dropout_report, "full_iteration")
    result = judge(reference, graphed, warmup_steps=2)
    assert result.verdict == Verdict.MATCH
    assert [s.phase for s in graphed.steps[:4]] == ["warmup", "warmup", "capture", "replay"]
    timing = result.timing
    # steps 5, 6, 7: after capture (step 2) and two settle steps; step 8 is the profiled one
    assert timing is not None and timing.num_steps == 3
    assert graphed.steps[-1].profiled and graphed.steps[-1].grads is None
    assert timing.speedup is not None and timing.speedup > 1.0


def test_dropout_zero_run_matches() -> None:
    report = load("h200_dropout0.json")
    reference = RunRecord.from_dict(report["reference"])
    for impl in ("local", "full_iteration"):
        (graphed,) = records(report, impl)
        assert judge(reference, graphed, warmup_steps=2).verdict == Verdict.MATCH


def test_tolerance_turns_small_difference_into_match(dropout_report: dict[str, Any]) -> None:
    reference = RunRecord.from_dict(dropout_report["reference"])
    graphed, _ = records(dropout_report, "local")
    assert find_divergence(reference, graphed, atol=1.0, rtol=0.0) is not None  # grads flagged
    nudged = dataclasses.replace(graphed, steps=tuple(
        dataclasses.replace(s, loss=s.loss + 1e-7, grads=None, params=None)
        for s in reference.steps))
    assert find_divergence(reference, nudged) is not None
    assert find_divergence(reference, nudged, atol=1e-6) is None


def fake_failure(status: str, phase: str | None = None) -> RunRecord:
    diag = Diagnosis(error_type="AcceleratorError", message="x", phase=phase)
    return RunRecord(impl="local", dropout=0.0, status=status, diagnosis=diag)


@pytest.mark.parametrize(("status", "phase", "verdict"), [
    ("error", "capture", Verdict.CAPTURE_FAILED),
    ("error", "warmup", Verdict.CAPTURE_FAILED),
    ("error", "replay", Verdict.CRASHED),
    ("crashed", None, Verdict.CRASHED),
    ("timeout", None, Verdict.TIMEOUT),
    ("unavailable", None, Verdict.UNAVAILABLE),
])
def test_failure_verdicts(dropout_report: dict[str, Any], status: str, phase: str | None,
                          verdict: Verdict) -> None:
    reference = RunRecord.from_dict(dropout_report["reference"])
    result = judge(reference, fake_failure(status, phase), warmup_steps=2)
    assert result.verdict == verdict
    assert result.diagnosis is not None


def test_failed_reference_fails_every_impl(dropout_report: dict[str, Any]) -> None:
    graphed, _ = records(dropout_report, "local")
    result = judge(fake_failure("crashed"), graphed, warmup_steps=2)
    assert result.verdict == Verdict.REFERENCE_FAILED
    assert not result.verdict.passed


def test_steady_timing_uses_replay_steps_only() -> None:
    def run(impl: str, phases: list[str], ms: list[float]) -> RunRecord:
        steps = tuple(StepRecord(step=i, phase=p, loss=1.0, step_time_ms=t)
                      for i, (p, t) in enumerate(zip(phases, ms, strict=True)))
        return RunRecord(impl=impl, dropout=0.0, status="ok", steps=steps)

    eager = run("none", ["eager"] * 8, [50, 40, 30, 20, 20, 10, 10, 12])
    graphed = run("full_iteration", ["warmup", "warmup", "capture"] + ["replay"] * 5,
                  [50, 40, 900, 9, 9, 2, 4, 3])
    timing = steady_timing(eager, graphed, warmup_steps=2)
    # capture at step 2, two settle steps (3, 4), timed steps 5..7
    assert timing.eager_ms == 10 and timing.graphed_ms == 3 and timing.num_steps == 3
    assert timing.speedup == pytest.approx(10 / 3)
    # spread: eager 10..12 ms, graphed 2..4 ms -> 10/4 .. 12/2
    assert timing.speedup_range == pytest.approx((2.5, 6.0))
    assert timing.measurable and timing.quiet


def test_a_speedup_whose_spread_straddles_one_is_not_measurable() -> None:
    def run(impl: str, phases: list[str], ms: list[float], quiet: bool = True) -> RunRecord:
        steps = tuple(StepRecord(step=i, phase=p, loss=1.0, step_time_ms=t, quiet=quiet)
                      for i, (p, t) in enumerate(zip(phases, ms, strict=True)))
        return RunRecord(impl=impl, dropout=0.0, status="ok", steps=steps)

    eager = run("eager", ["eager"] * 8, [9, 9, 9, 9, 9, 10, 11, 12])
    graphed = run("local", ["capture"] + ["replay"] * 7, [50, 9, 9, 9, 9, 9, 11, 13], quiet=False)
    timing = steady_timing(eager, graphed, warmup_steps=2)
    assert timing.speedup_range is not None and timing.speedup_range[0] < 1 < timing.speedup_range[1]
    assert not timing.measurable and not timing.quiet
    assert Timing.from_dict(timing.to_dict()) == timing


def test_records_round_trip(dropout_report: dict[str, Any]) -> None:
    reference = RunRecord.from_dict(dropout_report["reference"])
    assert RunRecord.from_dict(reference.to_dict()) == reference
    diff = TensorDiff(num_tensors=2, num_unequal=1, max_abs=1.0, max_rel=0.5, first_tensor="w")
    assert TensorDiff.from_dict(diff.to_dict()) == diff
