"""Artifacts of one real `graphdoctor diff` on the H200 (default model, dropout 0.1): the report
JSON, the Chrome trace of every run's profiled step and the memory snapshots of the graphed runs.

The launch accounting of each trace is held against an event-by-event count of it (tests/unit/raw_trace.py);
each row's verdict and launch comparison are derived again from the runs the report recorded (steps,
fingerprints, launch sections) with diff's own judge; the live figures are kept as a snapshot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.compare.verdict import judge
from graphdoctor.diff import DiffReport, load_report
from graphdoctor.launches.accounting import account_trace
from graphdoctor.memory import triage
from tests.unit.raw_trace import count_launches, load_events, phase_ranges

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data"
REPORT = DATA / "diff" / "h200_default_dropout0.1.json"
TRACES = DATA / "launches" / "megatron"
SNAPSHOTS = DATA / "memory" / "megatron"
FIELDS = ("num_host_launches", "num_kernel_launches", "num_graph_launches",
          "num_prologue_fill_launches", "num_gpu_kernels_eager", "num_gpu_kernels_in_graph",
          "kernels_per_graph_launch")


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return json.loads(REPORT.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def loaded() -> DiffReport:
    return load_report(REPORT)


def runs(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = [report["reference"]]
    if report.get("control_reference"):
        out.append(report["control_reference"])
    for entry in report["impls"]:
        out.extend(entry.get("runs", []))
    return out


def test_every_run_left_a_trace(report: dict[str, Any]) -> None:
    names = {Path(r["launches"]["trace"]).name for r in runs(report)}
    assert names == {p.name for p in TRACES.glob("*.json.gz")}
    assert len(names) == 5


@pytest.mark.parametrize("index", range(5))
def test_offline_count_snapshot_equals_live(report: dict[str, Any], index: int) -> None:
    """Snapshot (regression): the live figures came from the same account_trace in the child; the
    independent check is test_offline_count_equals_an_event_by_event_count."""
    run = runs(report)[index]
    live = run["launches"]["step"]
    accounting = account_trace(TRACES / Path(run["launches"]["trace"]).name)
    offline = [p for p in accounting.phases if p.impl == run["impl"]][-1].to_dict()
    for field in FIELDS:
        assert offline[field] == live[field], field
    assert offline["phase"] == ("eager" if run["impl"] == "none" else "replay")


@pytest.mark.parametrize("index", range(5))
def test_offline_count_equals_an_event_by_event_count(report: dict[str, Any], index: int) -> None:
    """The profiled step's launch calls, GPU kernels (eager, RNG prologue, per graph launch) and memory
    operations, counted again from the trace's raw events inside its `graphdoctor/<impl>/<phase>/<step>` range."""
    run = runs(report)[index]
    path = TRACES / Path(run["launches"]["trace"]).name
    events = load_events(path)
    ((name, start, end),) = phase_ranges(events)
    (phase,) = account_trace(path).phases
    assert phase.label == name and phase.impl == run["impl"]
    raw = count_launches(events, start, end)
    expected = raw.launch_fields()
    assert {k: phase.to_dict()[k] for k in expected} == expected
    assert phase.graph_coverage == pytest.approx(raw.graph_coverage, abs=1e-9)
    assert raw.calls_by_kind["graph"] == (0 if run["impl"] == "none" else len(raw.kernels_per_graph_launch))


def _rows(loaded: DiffReport) -> list[Any]:
    return [row for row in loaded.results if row.runs]


def test_census_equals_profiler_per_graph(report: dict[str, Any], loaded: DiffReport) -> None:
    """Each graph's kernels in the census the child took equal the kernels of one graph launch in the
    profiled step's raw trace; the row's census check, derived again by diff's judge, says so."""
    rows = _rows(loaded)
    assert [row.impl for row in rows] == ["local", "full_iteration"]
    recorded = {e["impl"]: e for e in report["impls"]}
    for row in rows:
        graphed = row.runs[0]
        assert graphed.launches is not None and graphed.launches.trace is not None
        census = recorded[row.impl]["launches"]["census"]
        census_kernels = sorted(c["nodes_by_type"]["KERNEL"] for c in census.values())
        events = load_events(TRACES / Path(graphed.launches.trace).name)
        ((_, start, end),) = phase_ranges(events)
        assert census_kernels == sorted(count_launches(events, start, end).kernels_per_graph_launch), row.impl
        again = judge(loaded.reference, graphed, warmup_steps=loaded.config.cuda_graph_warmup_steps)
        assert again.launches is not None and again.launches.census_check is not None
        assert again.launches.census_check.match, row.impl
        assert list(again.launches.census_check.census_kernels_per_graph) == census_kernels
        assert len(census_kernels) == {"local": 8, "full_iteration": 1}[row.impl]


def test_rows_are_judged_again_from_their_recorded_runs(report: dict[str, Any], loaded: DiffReport) -> None:
    """diff's judge on the recorded steps and fingerprints (with the dropout-free control pair where the row
    ran one) gives the recorded verdict, first divergence, control pair and launch comparison."""
    cfg = loaded.config
    verdicts = {}
    for row in _rows(loaded):
        graphed, *control = row.runs
        again = judge(loaded.reference, graphed, warmup_steps=cfg.cuda_graph_warmup_steps, rtol=cfg.rtol,
                      atol=cfg.atol, control_reference=loaded.control_reference if control else None,
                      control_graphed=control[0] if control else None)
        assert (again.verdict, again.divergence, again.control) == (row.verdict, row.divergence, row.control)
        assert again.launches is not None and row.launches is not None
        assert again.launches.to_dict() == row.launches.to_dict()
        verdicts[row.impl] = again.verdict.value
    recorded = {e["impl"]: e["verdict"] for e in report["impls"] if e["runs"]}
    assert verdicts == recorded == {"local": "rng-divergence", "full_iteration": "match"}


def test_graphs_cut_host_launches(loaded: DiffReport) -> None:
    """Counted from the raw traces: each graphed step makes fewer host launch calls than the eager one, and
    launches its graphs."""
    assert loaded.reference.launches is not None and loaded.reference.launches.trace is not None
    eager_events = load_events(TRACES / Path(loaded.reference.launches.trace).name)
    eager = count_launches(eager_events, *phase_ranges(eager_events)[0][1:])
    assert eager.calls_by_kind["graph"] == 0
    for row in _rows(loaded):
        graphed_run = row.runs[0]
        assert graphed_run.launches is not None and graphed_run.launches.trace is not None
        events = load_events(TRACES / Path(graphed_run.launches.trace).name)
        graphed = count_launches(events, *phase_ranges(events)[0][1:])
        assert sum(graphed.calls_by_kind.values()) < sum(eager.calls_by_kind.values()), row.impl
        assert graphed.calls_by_kind["graph"] >= 1, row.impl


@pytest.mark.parametrize("impl", ["local", "full_iteration"])
def test_snapshot_pools_match_report(report: dict[str, Any], impl: str) -> None:
    memory = next(e for e in report["impls"] if e["impl"] == impl)["memory"]
    assert memory["verdict"] == "ok"
    assert memory["snapshot_vs_stats_pct"] is not None and memory["snapshot_vs_stats_pct"] < 1.0
    result = triage(SNAPSHOTS / f"snapshot-{impl}-d0.1-after_replays.pickle.gz").to_dict()
    text = json.dumps(result)
    assert str(memory["graph_pool_reserved_bytes"]) in text


def test_triage_against_capture_is_block_level(report: dict[str, Any]) -> None:
    """Capture adds live blocks in the graph's private pool, and nothing is freed there."""
    before = SNAPSHOTS / "snapshot-full_iteration-d0.1-before_capture.pickle.gz"
    after = SNAPSHOTS / "snapshot-full_iteration-d0.1-after_capture.pickle.gz"
    diff = triage(after, against=before).to_dict()["diff"]
    pools = {row["key"]: row for row in diff["by_pool"]}
    graph = pools["graph 0,1"]
    assert graph["num_new"] > 0 and graph["num_freed"] == 0
    assert diff["total"]["net_bytes"] == sum(row["net_bytes"] for row in diff["by_pool"])
    memory = next(e for e in report["impls"] if e["impl"] == "full_iteration")["memory"]
    captured = memory["live_bytes_after_capture"] - memory["live_bytes_before_capture"]
    assert graph["new_bytes"] <= captured
