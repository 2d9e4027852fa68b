"""Launch accounting of the real H200 fixtures: held against an event-by-event count of the same trace
(tests/unit/raw_trace.py) and against live figures that do not come from the accounting (the profiler's
key_averages(), the graph census), plus a snapshot of the accounting document the GPU machine wrote.

Fixtures come from `python fixtures/record_launches.py fixtures/data/launches/h200` on a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.launches import TraceAccounting, account_trace, parse_dot_file
from tests.unit.raw_trace import count_launches, load_events, phase_ranges

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
def accounting() -> TraceAccounting:
    return account_trace(H200 / "trace_toy.json.gz")


@pytest.fixture(scope="module")
def offline(accounting: TraceAccounting) -> dict[str, Any]:
    document = accounting.to_dict()
    document["source"] = "trace_toy.json.gz"
    return document


def test_accounting_of_each_phase_equals_an_event_by_event_count(accounting: TraceAccounting) -> None:
    """Every figure of each phase range, and of the whole trace, counted again from the raw events: launch
    calls by name, kernel/graph/memcpy launches, GPU kernels by the call that launched them, kernels per graph
    launch, RNG prologue fills, memory operations and the kernel time in graphs."""
    events = load_events(H200 / "trace_toy.json.gz")
    ranges = phase_ranges(events)
    assert [name for name, _, _ in ranges] == ["graphdoctor/toy/eager/0", "graphdoctor/toy/replay/0"]
    assert [p.label for p in accounting.phases] == [name for name, _, _ in ranges]
    for (name, start, end), phase in zip(ranges, accounting.phases, strict=True):
        raw = count_launches(events, start, end)
        expected = raw.launch_fields()
        assert {k: phase.to_dict()[k] for k in expected} == expected, name
        assert phase.graph_coverage == pytest.approx(raw.graph_coverage, abs=1e-9), name
    whole = count_launches(events)
    expected = whole.launch_fields()
    assert {k: accounting.total.to_dict()[k] for k in expected} == expected
    assert accounting.total.num_gpu_kernels_unattributed == whole.unattributed_kernels
    # the count is not vacuous: the graphed step launched both graphs after their RNG prologue
    replay = count_launches(events, *ranges[1][1:])
    assert replay.kernels_per_graph_launch == [10, 14] and replay.prologue_fills == 2


def test_offline_accounting_snapshot_equals_the_document_recorded_on_the_gpu(
        live: dict[str, Any], offline: dict[str, Any]) -> None:
    """Snapshot (regression): the document the same account_trace wrote on the GPU machine; the independent
    checks are the event-by-event count above and the key_averages()/census tests below."""
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
