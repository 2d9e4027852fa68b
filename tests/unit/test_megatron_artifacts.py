"""Artifacts of one real `graphdoctor diff` on the H200 (default model, dropout 0.1): the report
JSON, the Chrome trace of every run's profiled step and the memory snapshots of the graphed runs.

Offline analysis here must reproduce what the live run reported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.launches.accounting import account_trace
from graphdoctor.memory import triage

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
def test_offline_count_equals_live(report: dict[str, Any], index: int) -> None:
    run = runs(report)[index]
    live = run["launches"]["step"]
    accounting = account_trace(TRACES / Path(run["launches"]["trace"]).name)
    offline = [p for p in accounting.phases if p.impl == run["impl"]][-1].to_dict()
    for field in FIELDS:
        assert offline[field] == live[field], field
    assert offline["phase"] == ("eager" if run["impl"] == "none" else "replay")


def test_census_equals_profiler_per_graph(report: dict[str, Any]) -> None:
    for entry in report["impls"]:
        if entry["verdict"] == "unavailable":
            continue
        check = entry["launches"]["census_check"]
        assert check["match"], entry["impl"]
        expected = {"local": 8, "full_iteration": 1}[entry["impl"]]
        assert len(check["census_kernels_per_graph"]) == expected


def test_graphs_cut_host_launches(report: dict[str, Any]) -> None:
    for entry in report["impls"]:
        if entry["verdict"] == "unavailable":
            continue
        launches = entry["launches"]
        assert launches["graphed"]["num_host_launches"] < launches["eager"]["num_host_launches"]
        assert launches["graphed"]["num_graph_launches"] >= 1


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
