"""advise ranking, recommendation and Megatron-LM flags, from real H200 diff reports (fixtures/data/diff)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from graphdoctor.advise import AdviseReport
from graphdoctor.advise.candidates import Candidate
from graphdoctor.advise.rank import (
    NOTHING_FASTER,
    RAN,
    CandidateResult,
    exit_code,
    megatron_flags,
    ranked,
    recommend,
)
from graphdoctor.compare.verdict import StepTimes, Timing
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport, load_report
from graphdoctor.envelope import open_envelope
from graphdoctor.report.advise import document, render_text
from graphdoctor.rules import check
from graphdoctor.types import Verdict

DIFF = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"


def from_report(name: str) -> tuple[DiffReport, list[CandidateResult]]:
    report = load_report(DIFF / name)
    return report, [CandidateResult(Candidate(r.impl), RAN, result=r) for r in report.results]


def test_fastest_passing_is_recommended_with_flags_and_memory() -> None:
    report, results = from_report("h200_small_dropout0_fingerprints_schema2.json")
    assert [r.candidate.impl for r in ranked(results)] == ["full_iteration", "local"]
    rec = recommend(results, report.config)
    assert rec.candidate == Candidate("full_iteration")
    assert rec.speedup == pytest.approx(19.211007595062256 / 5.641024112701416)
    assert rec.flags == "--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad"
    memory = report.results[1].memory
    assert memory is not None and memory.report is not None
    assert rec.graph_pool_bytes == memory.report.graph_pool_reserved_bytes > 0
    assert rec.peak_reserved_over_eager == pytest.approx(1.77, abs=0.01)
    assert exit_code(results) == 0


def test_rng_divergence_passes_unless_strict() -> None:
    report, results = from_report("h200_small_clean_dropout_local_fingerprints_schema2.json")
    (local,) = results
    assert local.verdict == Verdict.RNG_DIVERGENCE and local.differs() is False
    rec = recommend(results, report.config)
    assert rec.candidate == Candidate("local") and rec.speedup == pytest.approx(2.0369, abs=1e-3)
    assert rec.flags == "--cuda-graph-impl local"
    assert any("rng-divergence" in n for n in rec.notes)
    strict = report.config.replace(strict_rng=True)
    assert recommend(results, strict).candidate is None and exit_code(results, strict_rng=True) == 1


def test_capture_failures_leave_nothing_to_recommend() -> None:
    report, results = from_report("h200_item_mlp_schema2.json")
    assert {r.verdict for r in results} == {Verdict.CAPTURE_FAILED}
    assert all(r.differs() is None for r in results)
    rec = recommend(results, report.config)
    assert rec.candidate is None and "no candidate passed" in rec.reason
    assert exit_code(results) == 1


def test_no_measurable_speedup_says_so() -> None:
    report, results = from_report("h200_small_dropout0_fingerprints_schema2.json")
    flat = []
    for r in results:
        assert r.result is not None and r.timing is not None and r.timing.eager is not None
        eager = r.timing.eager
        slow = Timing(eager=StepTimes(eager.median_ms, eager.min_ms * 0.5, eager.max_ms * 2, 3),
                      graphed=StepTimes(eager.median_ms * 0.95, eager.median_ms * 0.9, eager.median_ms, 3))
        flat.append(dataclasses.replace(r, result=dataclasses.replace(r.result, timing=slow)))
    rec = recommend(flat, report.config)
    assert rec.candidate is None and rec.reason.startswith(NOTHING_FASTER)
    assert exit_code(flat) == 0  # a passing configuration exists; it is just not faster


@pytest.mark.parametrize("candidate, spec, flags", [
    (Candidate("local"), None, "--cuda-graph-impl local"),
    (Candidate("local", ("attn", "mlp")), None, "--cuda-graph-impl local --cuda-graph-modules attn mlp"),
    (Candidate("transformer_engine", ("attn",)), "te", "--cuda-graph-impl transformer_engine --cuda-graph-modules attn --te-rng-tracker"),
    (Candidate("local", ("moe_router",)), "te", "--cuda-graph-impl local --cuda-graph-modules moe_router --te-rng-tracker"),
])
def test_flags_are_megatron_lm_s_and_lint_clean(candidate: Candidate, spec: str | None, flags: str) -> None:
    config = DiffConfig(layer_spec=spec, dropout=0.0)
    assert megatron_flags(candidate, config) == flags
    transformer = {"num_moe_experts": 4, "moe_router_topk": 2} if "moe" in flags else {}
    # the user's own launch line says which layer implementation the model uses
    layers = "transformer_engine" if spec == "te" else "local"
    line = f"{flags} --transformer-impl {layers} --hidden-dropout 0 --attention-dropout 0"
    found = check({"transformer": transformer}, megatron_args=line)
    assert not found.has_errors and "GD116" not in found.codes(), found.codes()


def test_report_round_trips_through_the_envelope_and_renders(tmp_path: Path) -> None:
    report, results = from_report("h200_default_dropout0.1_schema2.json")
    results = [r for r in results if r.verdict != Verdict.UNAVAILABLE] + [
        CandidateResult(Candidate("transformer_engine"), "unavailable", reason="transformer_engine is not installed")]
    advise = AdviseReport(config=report.config, results=tuple(results),
                          recommendation=recommend(results, report.config), reference=report.reference,
                          wall_s=70.0, jobs=report.jobs)
    doc = json.loads(json.dumps(document(advise)))
    assert doc["command"] == "advise" and doc["schema_version"] == 2 and doc["exit_code"] == 0
    assert doc["recommendation"]["flags"].startswith("--cuda-graph-impl full_iteration")
    back = AdviseReport.from_dict(open_envelope(doc, legacy_command="advise").payload)
    assert render_text(back) == render_text(advise)
    text = render_text(advise)
    lines = text.splitlines()
    first_row = next(line for line in lines if line.startswith("1 "))
    assert "full_iteration whole step" in first_row and "match ok" in first_row
    assert any(line.startswith("2 ") and "local whole layer" in line and "rng-divergence ok*" in line for line in lines)
    assert "transformer_engine is not installed" in text
    assert "recommendation: full_iteration whole step: 3.59x" in text
    assert text.rstrip().endswith("exit code 0")


def test_html_page_of_the_advise() -> None:
    from graphdoctor.report.advise_html import render_html

    report, results = from_report("h200_default_dropout0.1_schema2.json")
    advise = AdviseReport(config=report.config, results=tuple(results),
                          recommendation=recommend(results, report.config), reference=report.reference)
    page = render_html(advise)
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "http" not in page.split("<main>")[1]
    assert "--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad" in page
    assert "full_iteration whole step" in page and "local whole layer" in page
    assert 'data-verdict="pass"' in page and "3.59x" in page
