"""The H200 diffs of Megatron-LM's own lines (tests/gpu/test_model_description_gpu.py, Transformer Engine 2.20.2,
kept as fixtures): the Llama-3 8B example shrunk to 2 layers at full width with TE attn+mlp graphs, and the Mixtral
8x7B example at 2 layers, 8 experts and a quarter width with TE moe_router+moe_preprocess graphs. Their reports
load here, say what was built and what was judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphdoctor.diff import DiffReport
from graphdoctor.report.diff import render_text
from graphdoctor.types import Verdict

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"


def _report(name: str) -> DiffReport:
    return DiffReport.from_dict(json.loads((DATA / name).read_text(encoding="utf-8")))


def test_the_llama3_line_was_built_as_megatron_lm_builds_it_and_matched() -> None:
    report = _report("h200_llama3_8b_line_schema2.json")
    assert [(r.impl, r.verdict) for r in report.results] == [("transformer_engine", Verdict.MATCH)]
    assert report.config.model is not None and report.config.model.source.startswith("launch line ")
    model = report.config.model
    assert (model.value("activation_func"), model.value("num_query_groups"), model.value("rotary_base")) == \
        ("torch.nn.functional.silu", 8, 1000000)
    assert ("--no-gradient-accumulation-fusion",) in model.line  # the flag given over the file (`@FILE FLAGS`)
    assert model.value("gradient_accumulation_fusion") is False
    assert report.reference.num_parameters == 1_486_901_248  # 2 layers at full width, untied 128256 x 4096 twice
    text = render_text(report)
    assert "  model: 2 layers x 4096, 32 heads / 8 query groups (GQA), ffn 14336 silu gated, rope (base 1000000), " \
           "RMSNorm, untied embeddings, vocab 128256, transformer_engine spec, bf16, 1.49 B parameters" in text
    assert report.exit_code() == 0


def test_the_mixtral_line_built_its_experts_and_matched() -> None:
    report = _report("h200_mixtral_8x7b_line_schema2.json")
    assert [(r.impl, r.verdict) for r in report.results] == [("transformer_engine", Verdict.MATCH)]
    assert report.model is not None and report.model["moe"] == {
        "num_experts": 8, "topk": 2, "dispatcher": "alltoall", "layer_freq": 1, "ffn_hidden_size": 3584,
        "shared_expert_size": None}
    assert report.config.cuda_graph_modules == ("moe_router", "moe_preprocess")
    assert "MoE 8 experts top-2 alltoall, 0.247 B parameters" in render_text(report)


@pytest.mark.parametrize("name", ["h200_llama3_8b_line_schema2.json", "h200_mixtral_8x7b_line_schema2.json"])
def test_the_reports_round_trip(name: str) -> None:
    report = _report(name)
    again = DiffReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.config == report.config and again.model == report.model
