"""Graph census from DOT (pure Python) on the committed synthetic DOT dump, and keep_graphs on CPU.

synthetic_graph.dot follows the cudaGraphDebugDotPrint verbose layout quoted in pytorch#126753;
its child-graph cluster is hand-made. Real dumps are covered by test_launches_real.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from graphdoctor.errors import UsageError
from graphdoctor.launches import GraphCensus, census_graph, megatron_graphs, parse_dot, parse_dot_file

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "launches"


def test_dot_census_counts_types_and_descends_into_child_graphs() -> None:
    census = parse_dot_file(DATA / "synthetic_graph.dot")
    assert census.source == "dot"
    assert census.nodes_by_type == {"MEMSET": 1, "KERNEL": 4, "GRAPH": 1, "MEMCPY": 1}
    assert census.num_kernels == 4
    assert census.num_nodes == 7
    assert census.num_child_graphs == 1
    assert census.top_kernels(1) == [("ampere_sgemm_128x64_tn", 2)]


def test_kernel_names_are_unescaped_and_stripped_of_launch_config() -> None:
    names = parse_dot_file(DATA / "synthetic_graph.dot").kernel_names
    assert all("<<<" not in n and "\\" not in n for n in names)
    assert any("fused_dropout_kernel_vec" in n for n in names)


def test_to_dict_round_trip_fields() -> None:
    document = parse_dot_file(DATA / "synthetic_graph.dot", name="g").to_dict()
    assert document["name"] == "g" and document["num_kernels"] == 4
    assert list(document["kernel_names"].values()) == sorted(document["kernel_names"].values(), reverse=True)


def test_not_a_dot_file() -> None:
    with pytest.raises(UsageError, match="digraph"):
        parse_dot("hello", name="x")


def test_empty_graph_dump_has_no_nodes() -> None:
    census = parse_dot('digraph dot {\nsubgraph cluster_1 {\nlabel="graph_1" graph[style="dashed"];\n}\n}\n')
    assert census.num_nodes == 0 and census.num_kernels == 0


def test_unknown_method_is_usage_error() -> None:
    with pytest.raises(UsageError, match="method"):
        census_graph(object(), method="nsys")


def test_megatron_graphs_empty_without_megatron_state() -> None:
    assert megatron_graphs() == {} or all(isinstance(k, str) for k in megatron_graphs())


def test_census_is_frozen() -> None:
    census = GraphCensus(name="g", source="dot")
    with pytest.raises(AttributeError):
        census.name = "h"  # type: ignore[misc]
