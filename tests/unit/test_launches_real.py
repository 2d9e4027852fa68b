"""Offline analysis of the real H200 fixtures equals the live numbers recorded next to them.

Fixtures come from `python fixtures/record_launches.py fixtures/data/launches/h200` on a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.launches import account_trace, parse_dot_file

H200 = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "launches" / "h200"
FILES = ("trace_toy.json.gz", "live.json", "graph_0.dot", "graph_1.dot")
_missing = [name for name in FILES if not (H200 / name).exists()]
pytestmark = pytest.mark.skipif(
    bool(_missing),
    reason=f"real launch fixtures not recorded yet (missing {', '.join(_missing)} in {H200}); "
    "run fixtures/record_launches.py on a GPU",
)


@pytest.fixture(scope="module")
def live() -> dict[str, Any]:
    return json.loads((H200 / "live.json").read_text())


@pytest.fixture(scope="module")
def offline() -> dict[str, Any]:
    document = account_trace(H200 / "trace_toy.json.gz").to_dict()
    document["source"] = "trace_toy.json.gz"
    return document


def test_offline_accounting_equals_live(live: dict[str, Any], offline: dict[str, Any]) -> None:
    assert offline == live["profiled"]["accounting"]


def test_offline_launch_calls_equal_key_averages(live: dict[str, Any], offline: dict[str, Any]) -> None:
    assert offline["total"]["launch_calls"] == live["profiled"]["live_launch_calls"]


def test_census_kernels_equal_kernels_per_graph_launch(live: dict[str, Any], offline: dict[str, Any]) -> None:
    replay = [t["graphed"] for t in offline["tables"] if t["impl"] == "toy"][0]
    per_launch = replay["kernels_per_graph_launch"]
    census = live["census"]
    assert len(per_launch) == len(census)
    for entry, launched in zip(census, per_launch, strict=False):
        assert entry["bindings"]["num_kernels"] == launched
        assert entry["dot"]["num_kernels"] == launched


def test_committed_dot_dumps_match_live_census(live: dict[str, Any]) -> None:
    for entry in live["census"]:
        census = parse_dot_file(H200 / f"graph_{entry['index']}.dot")
        assert census.num_kernels == entry["bindings"]["num_kernels"]
        assert census.nodes_by_type == entry["dot"]["nodes_by_type"]


def test_graphed_step_has_prologue_fills_and_fewer_launches(offline: dict[str, Any]) -> None:
    table = [t for t in offline["tables"] if t["impl"] == "toy"][0]
    eager, graphed = table["eager"], table["graphed"]
    assert graphed["num_graph_launches"] == 2
    assert graphed["num_prologue_fill_launches"] > 0
    assert graphed["num_prologue_fill_launches"] == graphed["num_gpu_kernels_prologue"]
    assert graphed["num_host_launches"] < eager["num_host_launches"]
    # The toy's Adam step stays eager, so coverage is partial (0.48 on the H200); what must hold
    # exactly is that every in-graph kernel belongs to one of the two graph launches.
    assert 0.0 < graphed["graph_coverage"] < 1.0
    assert graphed["num_gpu_kernels_in_graph"] == sum(graphed["kernels_per_graph_launch"])
