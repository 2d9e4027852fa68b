"""`graphdoctor advise` on a real GPU (issue 18 acceptance): dense local spec in fp32, the TE spec in bf16
(bisection to attention), an MoE model (rejected scopes with their rules), and graph_layers itself.

Each advise keeps to about 3 minutes on one H200 (2 layers, hidden 128, seq 64, 8 steps, dropout 0,
four children at a time). Set GD_REPORT_DIR to keep each JSON document and terminal table for docs/.
"""

from __future__ import annotations

import importlib.util

import pytest
from kept import diff, keep
from te_gate import te_import_error

from graphdoctor.advise import advise
from graphdoctor.advise.candidates import Candidate
from graphdoctor.advise.rank import RAN, REJECTED
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport
from graphdoctor.types import Verdict

pytestmark = pytest.mark.gpu

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64, "vocab_size": 512,
         "steps": 8, "cuda_graph_warmup_steps": 2, "timeout_s": 300.0, "dropout": 0.0, "jobs": 4}
RAN_VERDICTS = (Verdict.MATCH, Verdict.RNG_DIVERGENCE, Verdict.NUMERIC_DIVERGENCE)
MOE = {"num_moe_experts": 4, "moe_router_topk": 2, "add_bias_linear": False}
needs_te = pytest.mark.needs_te  # fails, not skips, where TE is installed or expected but broken (conftest.py)




def test_advise_dense_local_spec_fp32() -> None:
    report = advise(DiffConfig(impls=("local", "full_iteration"), **SMALL), time_budget_s=240)
    text = keep(report, "advise_dense_fp32")
    assert report.reference is not None and report.reference.status == "ok"
    labels = [r.candidate.label for r in report.candidates]
    assert labels == ["full_iteration whole step", "local whole layer", "local attn", "local mlp"]
    # local attn / mlp graph the whole GPT layer in megatron-core 0.19.2: rejected before any run (GD219)
    ran = [r for r in report.candidates if r.status == RAN]
    assert [r.candidate.label for r in ran] == labels[:2], text
    assert all(r.verdict in RAN_VERDICTS for r in ran), text
    rejected = {r.candidate.label: [x.rule for x in r.rejections] for r in report.candidates if r.status == REJECTED}
    assert rejected == {"local attn": ["GD219"], "local mlp": ["GD219"]}, text
    full = report.result_of(Candidate("full_iteration"))
    assert full is not None and full.verdict == Verdict.MATCH and full.timing is not None, text
    assert full.result is not None and full.result.memory is not None and full.result.launches is not None
    assert report.exit_code() == 0 and "recommendation: " in text
    rec = report.recommendation
    assert rec.candidate is None or rec.flags.startswith(f"--cuda-graph-impl {rec.candidate.impl}")
    if importlib.util.find_spec("transformer_engine") is None:
        # Where TE is importable, Megatron 0.19.2's local graphs differ at dropout 0 (WITHOUT_TE_REASON):
        # then local is bisected instead.
        assert all(r.verdict == Verdict.MATCH for r in ran), text
        assert report.bisections == ()


@needs_te
def test_advise_te_spec_bf16_bisects_to_attention() -> None:
    report = advise(DiffConfig(impls=("transformer_engine",), dtype="bf16", layer_spec="te", **SMALL),
                    time_budget_s=240)
    text = keep(report, "advise_te_bf16")
    by_scope = {r.candidate.scope: r for r in report.candidates}
    assert by_scope["mlp"].verdict == Verdict.MATCH, text
    assert by_scope["attn"].verdict == Verdict.NUMERIC_DIVERGENCE, text
    (bisection,) = report.bisections
    assert bisection.start == Candidate("transformer_engine"), text
    assert bisection.narrowed.modules == ("attn",), text
    assert "narrowed to transformer_engine attn" in text
    assert report.exit_code() == 0


def test_advise_moe_lists_rejected_scopes_with_rules() -> None:
    """Dropless MoE (4 experts, top-2): `mlp` (every layer is MoE) and `moe` (dropless) are rejected
    before any GPU run; the rest run (whole-layer local graphs of a dropless MoE fail to capture on
    megatron-core 0.19.2: the token dispatcher copies to the host) and are ranked."""
    report = advise(DiffConfig(impls=("local", "full_iteration", "transformer_engine"), dtype="bf16",
                               transformer=dict(MOE), **SMALL), time_budget_s=170)
    text = keep(report, "advise_moe")
    rejected = {r.candidate.label: [x.rule for x in r.rejections] for r in report.candidates if r.status == REJECTED}
    assert "GD204" in rejected["local mlp"], text
    assert "GD205" in rejected["local moe"], text
    assert "rejected: local mlp: GD204" in text
    assert any(r.status == RAN for r in report.candidates), text
    for result in report.candidates:
        if result.status == RAN:
            assert result.verdict is not None
    by_label = {r.candidate.label: r for r in report.candidates}
    for label in ("full_iteration whole step", "local whole layer"):  # the dispatcher's host copy is captured
        failed = by_label[label]
        if failed.status == RAN:
            assert failed.verdict == Verdict.CAPTURE_FAILED, text
            assert failed.result is not None and failed.result.diagnosis is not None
            assert failed.result.diagnosis.rule == "GD217", text
    scoped = by_label["transformer_engine attn+moe_router+moe_preprocess"]
    if te_import_error() is None and scoped.status == RAN:
        # the scope stops before token dispatch (docs/moe.md: it matches under diff too)
        assert scoped.verdict == Verdict.MATCH, text


def _graph_launches(report: DiffReport) -> int:
    """cudaGraphLaunch calls in the profiled graphed step of a one-implementation diff that ran."""
    (result,) = report.results
    assert result.verdict in RAN_VERDICTS, result
    assert result.launches is not None and result.launches.graphed is not None
    return result.launches.graphed.num_graph_launches


def test_graph_layers_graphs_only_the_named_layers() -> None:
    """local over layer 1 of 2: half of the whole layer's graph launches, still equal to eager where TE
    is not importable."""
    whole = diff(DiffConfig(impls=("local",), **SMALL))
    one = diff(DiffConfig(impls=("local",), graph_layers=(1,), **SMALL))
    counts = [_graph_launches(report) for report in (whole, one)]
    assert counts[1] * 2 == counts[0] and counts[1] > 0, counts


@needs_te
def test_graph_layers_with_transformer_engine() -> None:
    cfg = {**SMALL, "dtype": "bf16", "layer_spec": "te"}
    whole = diff(DiffConfig(impls=("transformer_engine",), cuda_graph_modules=("attn",), **cfg))
    one = diff(DiffConfig(impls=("transformer_engine",), cuda_graph_modules=("attn",), graph_layers=(0,), **cfg))
    counts = [_graph_launches(report) for report in (whole, one)]
    assert 0 < counts[1] < counts[0], counts
