"""A run file's graph settings and model shape under `transformer:` on a real GPU (config._fill_from_transformer):
the eager reference builds no graphs, the implementation the settings turn on is the one diffed, and the model
built is the shape reported. Before, `enable_cuda_graph: true` graphed the eager child and `cuda_graph_scope:
full_iteration` made every child, eager included, a full_iteration run."""

from __future__ import annotations

from pathlib import Path

import pytest
from kept import diff

from graphdoctor.cli.diff import build_config
from graphdoctor.options import DIFF_OPTIONS
from graphdoctor.types import Verdict

pytestmark = pytest.mark.gpu

SMALL = ("  num_layers: 2\n  hidden_size: 128\n  num_attention_heads: 4\n  hidden_dropout: 0.0\n"
         "  attention_dropout: 0.0\nrun:\n  steps: 6\n  seq_length: 64\n  vocab_size: 512\n  timeout_s: 240\n")


@pytest.mark.without_te
@pytest.mark.parametrize(("graphs", "impl", "num_graphs"), [
    ("  enable_cuda_graph: true\n", "local", 4),
    ("  cuda_graph_impl: local\n  cuda_graph_scope: full_iteration\n", "full_iteration", 1),
])
def test_graph_settings_under_transformer_diff_their_implementation_against_a_true_eager(
        tmp_path: Path, graphs: str, impl: str, num_graphs: int) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("transformer:\n" + graphs + SMALL, encoding="utf-8")
    config = build_config(str(path), {option.field: None for option in DIFF_OPTIONS})
    assert config.impls == (impl,) and (config.num_layers, config.hidden_size) == (2, 128)
    report = diff(config)
    eager = report.reference
    assert eager.status == "ok" and eager.launches is not None and eager.launches.step is not None
    assert eager.launches.step.num_graph_launches == 0  # the eager reference is eager
    row, = report.results
    assert row.impl == impl and row.verdict == Verdict.MATCH, row
    graphed = row.runs[0].launches if row.runs else None
    assert graphed is not None and graphed.step is not None and graphed.step.num_graph_launches == num_graphs
