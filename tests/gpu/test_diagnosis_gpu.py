"""diff's diagnosis of the planted capture failures names the planted line and the culprit's own rule
(not GD501 for every capture that fails): real Megatron-Core models on a real GPU."""

from __future__ import annotations

import pytest
from kept import diff

from fixtures.planted.markers import marked_line
from graphdoctor.config import DiffConfig
from graphdoctor.rules import rule_fix
from graphdoctor.types import Verdict

pytestmark = pytest.mark.gpu

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64,
         "vocab_size": 512, "steps": 6, "cuda_graph_warmup_steps": 2, "timeout_s": 240.0}


@pytest.mark.parametrize(("module", "code"), [
    ("default_stream_mlp", "GD503"), ("nonzero_mlp", "GD502"), ("item_mlp", "GD501"),
])
def test_planted_capture_failure_cites_its_rule_and_line(module: str, code: str) -> None:
    config = DiffConfig(impls=("local",), dropout=0.0, layer_spec=f"fixtures.planted.{module}:layer_spec",
                        **SMALL)
    report = diff(config)
    (local,) = report.results
    assert local.verdict == Verdict.CAPTURE_FAILED, local
    diag = local.diagnosis
    assert diag is not None
    assert diag.rule == code, diag
    assert diag.fix == rule_fix(code)
    assert diag.location is not None
    assert diag.location.endswith(f"{module}.py:{marked_line(module, code)}"), diag
    assert report.exit_code() == 1
