"""analyze_run: graph pool bytes, peaks vs eager, growth per replay step, unfreed replay allocations.

Synthetic snapshots (graphdoctor.memory.synthetic.graphed_run) in the torch 2.11 layout.
"""

from __future__ import annotations

import json

import pytest

from graphdoctor.errors import UsageError
from graphdoctor.memory.leaks import analyze_run
from graphdoctor.memory.synthetic import graphed_run

PEAKS = {
    "eager_peak_allocated_bytes": 40 << 20,
    "eager_peak_reserved_bytes": 60 << 20,
    "peak_allocated_bytes": 58 << 20,
    "peak_reserved_bytes": 82 << 20,
}


def test_clean_run_is_ok() -> None:
    report = analyze_run(*graphed_run(num_replay_steps=6), num_replay_steps=6, **PEAKS)
    assert report.verdict == "ok"
    assert report.graph_pool_reserved_bytes == 20 << 20
    assert [p.pool for p in report.graph_pools] == [(1, 0)]
    assert report.capture_cost_bytes == 18 << 20
    # only the last step's 4-byte loss (one 512-byte block) is still alive: not a suspect
    assert 0 < report.bytes_gained_per_replay_step < 512
    assert [s.is_suspect for s in report.unfreed_replay_sites] == [False]
    assert report.phase_tags_found
    line = report.summary()
    assert line.startswith("memory ok: graph pools 20.0 MiB, peak reserved 1.37x eager")
    assert "\n" not in line


def test_planted_leak_is_growth() -> None:
    report = analyze_run(*graphed_run(num_replay_steps=6, leak_bytes=1 << 20), num_replay_steps=6, **PEAKS)
    assert report.verdict == "growth"
    assert report.bytes_gained_per_replay_step == pytest.approx((6 * (1 << 20) + 512) / 6)
    top = report.unfreed_replay_sites[0]
    assert top.is_suspect and top.site == "work/train.py:52 train_step"
    assert (top.num_allocations, top.num_steps, top.live_bytes) == (6, 6, 6 << 20)
    assert top.frames[0].startswith("work/train.py:52")
    assert "1 site(s) keep replay allocations alive" in report.summary()


def test_small_leak_below_threshold_still_flagged_by_sites() -> None:
    report = analyze_run(*graphed_run(num_replay_steps=4, leak_bytes=4096), num_replay_steps=4, **PEAKS)
    assert report.bytes_gained_per_replay_step < report.growth_threshold_bytes
    assert report.verdict == "growth"


def test_to_dict_is_json_and_complete() -> None:
    report = analyze_run(*graphed_run(num_replay_steps=2), num_replay_steps=2, **PEAKS)
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["verdict"] == "ok"
    assert doc["graph_pools"] == [{"pool": [1, 0], "reserved_bytes": 20 << 20, "live_bytes": 18 << 20}]
    assert doc["peak_reserved_over_eager"] == pytest.approx(82 / 60, abs=1e-4)
    assert doc["summary"] == report.summary()


def test_unknown_eager_peaks_and_untagged_trace() -> None:
    before, captured, after = graphed_run(num_replay_steps=2)
    for entry in after["device_traces"][0]:
        entry["user_metadata"] = ""
    report = analyze_run(before, captured, after, num_replay_steps=2, eager_peak_allocated_bytes=None,
                         eager_peak_reserved_bytes=None, peak_allocated_bytes=1, peak_reserved_bytes=2)
    assert not report.phase_tags_found
    assert any("no 'replay' phase tags" in n for n in report.notes)
    assert report.to_dict()["peak_reserved_over_eager"] is None


def test_bad_arguments() -> None:
    snaps = graphed_run(num_replay_steps=1)
    with pytest.raises(UsageError, match="num_replay_steps: got 0"):
        analyze_run(*snaps, num_replay_steps=0, **PEAKS)
    with pytest.raises(UsageError, match="growth_threshold_bytes"):
        analyze_run(*snaps, num_replay_steps=1, growth_threshold_bytes=-1, **PEAKS)
