"""advise documents recorded on one H200 (fixtures/data/advise, README there): the ranking, the recommendation,
the screening and the bisection derived again from what the reports record, the tables and the bisection
rendered from them, and a MoE capture failure in a candidate gets diff's GD217 diagnosis (every candidate row
goes through VerdictTree.judge_impl, which adds the static findings)."""

from __future__ import annotations

import json
from pathlib import Path

from graphdoctor.advise import AdviseReport, plan
from graphdoctor.advise.bisect import bisect, bisect_start
from graphdoctor.advise.candidates import Candidate, is_moe
from graphdoctor.advise.rank import NOTHING_FASTER, RAN, REJECTED, ranked, recommend
from graphdoctor.parent.static import with_static_findings
from graphdoctor.report.advise import render_text, row
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.types import Verdict

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "advise"
H200_NO_TE = EnvironmentFacts(torch_version="2.11.0", gpu_capability=(9, 0), te_version=None)
"""The machine the dense advise ran on, as the screening reads it."""


def _load(name: str) -> AdviseReport:
    return AdviseReport.from_dict(json.loads((DATA / name).read_text()))


def test_dense_fp32_recommends_full_iteration_and_rejects_the_local_scopes() -> None:
    """The ranking and the recommendation derived again from the candidates' recorded verdicts and timings
    (advise.rank), and the rejections derived again by screening the recorded configuration (advise.plan)."""
    report = _load("h200_advise_dense_fp32.json")
    results = list(report.results)
    order = ranked(results, report.config.strict_rng)
    assert [r.candidate.label for r in order] == ["full_iteration whole step", "local whole layer"]
    assert {r.verdict for r in order} == {Verdict.MATCH}
    again = recommend(results, report.config)
    assert again == report.recommendation
    assert again.candidate is not None and again.candidate.label == "full_iteration whole step"
    assert again.flags == "--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad"
    assert again.speedup_range is not None and again.speedup_range[0] > 1.0
    assert "Megatron-LM flags: --cuda-graph-impl full_iteration" in render_text(report)
    screened = plan(report.config, facts=H200_NO_TE)
    assert [s.candidate.label for s in screened] == [r.candidate.label for r in report.candidates]
    assert [s.runnable for s in screened] == [r.status == RAN for r in report.candidates]
    recorded = {r.candidate.label: [x.rule for x in r.rejections] for r in report.candidates if r.status == REJECTED}
    assert recorded == {"local attn": ["GD219"], "local mlp": ["GD219"]}
    # `local attn` graphs the whole layer anyway (GD219). For `local mlp` the catalogue has since gained GD240,
    # the crash Megatron's model build hits there, which now rejects it ahead of GD219.
    assert {s.candidate.label: [x.rule for x in s.rejections] for s in screened if s.rejections} == {
        "local attn": ["GD219"], "local mlp": ["GD240"]}
    assert report.exit_code() == 0


def test_te_bf16_bisects_the_divergence_to_attention_of_layer_0() -> None:
    """The bisection replayed from the recorded candidates' verdicts (advise.bisect asks a judge and runs nothing
    itself) is the recorded one; the recommendation is derived again from the recorded verdicts and timings."""
    report = _load("h200_advise_te_bf16.json")
    text = render_text(report)
    starts = bisect_start([(r.candidate, r.differs()) for r in report.candidates])
    assert [s.label for s in starts] == ["transformer_engine whole layer"]

    def recorded_verdict(candidate: Candidate) -> bool | None:
        known = report.result_of(candidate)
        return None if known is None else known.differs()

    again = bisect(starts[0], report.config.num_layers, recorded_verdict, moe=is_moe(report.config))
    assert report.bisections == (again,)
    assert [(s.stage, s.candidate.label, s.differs) for s in again.steps] == [
        ("scope", "transformer_engine attn", True), ("scope", "transformer_engine mlp", False),
        ("layers", "transformer_engine attn (layer 0)", True)]
    assert again.narrowed.modules == ("attn",) and again.narrowed.layers == (0,)
    assert again.stopped == "one layer"
    assert "narrowed to transformer_engine attn (layer 0)" in text
    by_label = {r.candidate.label: r for r in report.candidates}
    assert by_label["transformer_engine mlp"].verdict == Verdict.MATCH
    assert by_label["transformer_engine attn"].verdict == Verdict.NUMERIC_DIVERGENCE
    # the only passing candidate is not measurably faster: no recommendation, and the line says why
    recommendation = recommend(list(report.results), report.config)
    assert recommendation == report.recommendation and recommendation.candidate is None
    assert recommendation.reason.startswith(f"{NOTHING_FASTER} (fastest passing: transformer_engine mlp at 0.96x")
    assert "no graph configuration is measurably faster" in text


def test_moe_capture_failure_in_a_candidate_is_diagnosed_gd217_at_the_dispatcher() -> None:
    """Recorded before advise's rows took diff's static findings: the H200 row says GD504 with no
    location. The same function diff applies names the token dispatcher's host copy."""
    report = _load("h200_advise_moe_dropless_no_te.json")
    failed = [r for r in report.candidates if r.status == RAN and r.verdict == Verdict.CAPTURE_FAILED]
    assert [r.candidate.label for r in failed] == ["full_iteration whole step", "local whole layer"]
    for candidate_result in failed:
        assert candidate_result.result is not None and candidate_result.result.diagnosis is not None
        assert candidate_result.result.diagnosis.rule == "GD504"  # as recorded
        fixed = with_static_findings(candidate_result.result, candidate_result.candidate.config(report.config))
        assert fixed.diagnosis is not None and fixed.diagnosis.rule == "GD217"
        assert fixed.diagnosis.location is not None
        assert fixed.diagnosis.location.startswith("megatron/core/transformer/moe/"), fixed.diagnosis.location
        cell = row("-", type(candidate_result)(candidate_result.candidate, RAN, result=fixed), False)[-1]
        assert cell.startswith("GD217 RuntimeError megatron/core/transformer/moe/"), cell
    rejected = {r.candidate.label: {x.rule for x in r.rejections} for r in report.candidates if r.status == REJECTED}
    assert {"GD204"} <= rejected["local mlp"] and {"GD205"} <= rejected["local moe"]
    assert report.exit_code() == 1


def test_moe_with_transformer_engine_ranks_the_scopes_before_dispatch_and_lists_the_rejected() -> None:
    """Recorded at acbe7a7 with Transformer Engine 2.20.2 staged: the candidates that graph past the token
    dispatcher fail capture there (GD217, recorded so), the scopes Megatron or the catalogue refuse are
    listed with their rules, and the four TE scopes that stop before dispatch all match and are ranked."""
    report = _load("h200_advise_moe_dropless_te.json")
    text = render_text(report)
    failed = [r for r in report.candidates if r.status == RAN and r.verdict == Verdict.CAPTURE_FAILED]
    assert [r.candidate.label for r in failed] == [
        "full_iteration whole step",
        "local whole layer",
        "transformer_engine whole layer",
    ]
    for candidate_result in failed:
        assert candidate_result.result is not None and candidate_result.result.diagnosis is not None
        assert candidate_result.result.diagnosis.rule == "GD217"
        assert candidate_result.result.diagnosis.location == "megatron/core/transformer/moe/token_dispatcher.py:317"
    matched = [r for r in report.candidates if r.status == RAN and r.verdict == Verdict.MATCH]
    assert {r.candidate.impl for r in matched} == {"transformer_engine"}
    assert {r.candidate.label for r in matched} == {
        "transformer_engine attn",
        "transformer_engine moe_router",
        "transformer_engine moe_router+moe_preprocess",
        "transformer_engine attn+moe_router+moe_preprocess",
    }
    rejected = {r.candidate.label: {x.rule for x in r.rejections} for r in report.candidates if r.status == REJECTED}
    assert set(rejected) == {
        "local attn",
        "local mlp",
        "local moe_router",
        "local moe",
        "transformer_engine mlp",
        "transformer_engine moe",
    }
    assert {"GD204"} <= rejected["transformer_engine mlp"] and {"GD205"} <= rejected["transformer_engine moe"]
    recommended = report.recommendation.candidate
    assert recommended is not None and recommended.impl == "transformer_engine"
    assert set(recommended.modules) <= {"attn", "moe_router", "moe_preprocess"}
    assert "--cuda-graph-impl transformer_engine --cuda-graph-modules" in text
    for label in rejected:
        assert f"rejected: {label}:" in text
    assert report.exit_code() == 0
