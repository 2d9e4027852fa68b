"""Live `graphdoctor count` on a real GPU with a real Megatron-Core model."""

from __future__ import annotations

import pytest

from graphdoctor.config import DiffConfig
from graphdoctor.count import count

pytestmark = pytest.mark.gpu


def test_live_count_small_model() -> None:
    report = count(DiffConfig(impls=("local", "full_iteration"), num_layers=2, hidden_size=128,
                              num_attention_heads=4, seq_length=64, vocab_size=512, steps=6))
    assert report.exit_code() == 0
    sections = dict(report.sections())
    for impl, graphs in (("local", 4), ("full_iteration", 1)):
        section = sections[impl]
        assert section.graphed is not None and section.eager is not None
        assert section.graphed.num_graph_launches == graphs
        assert section.census_check is not None and section.census_check.match
        assert section.graphed.num_host_launches < section.eager.num_host_launches
