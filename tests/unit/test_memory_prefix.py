"""Segments-only loading (load_snapshot_segments): same segments and triage as the full load,
fallbacks on unexpected layouts, hostile pickles still execute nothing, truncation still an error."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.errors import InputFileError
from graphdoctor.memory import triage
from graphdoctor.memory.loader import load_snapshot, load_snapshot_segments
from graphdoctor.memory.synthetic import graphed_run

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "memory"
REAL = sorted([*DATA.glob("*.pickle.gz"), *(DATA / "megatron").glob("*.pickle.gz")])
PAIRS = [
    ("leak_after_capture", "leak"),
    ("graphed_before", "graphed_after_capture"),
    ("graphed_after_capture", "graphed"),
    ("megatron/snapshot-local-d0.1-before_capture", "megatron/snapshot-local-d0.1-after_capture"),
    ("megatron/snapshot-local-d0.1-after_capture", "megatron/snapshot-local-d0.1-after_replays"),
    ("megatron/snapshot-full_iteration-d0.1-before_capture", "megatron/snapshot-full_iteration-d0.1-after_capture"),
    ("megatron/snapshot-full_iteration-d0.1-after_capture", "megatron/snapshot-full_iteration-d0.1-after_replays"),
]
TRACE_FIELDS = ("num_trace_entries", "trace_device", "phases")


class _RunsCommand:
    """Pickles to os.system(<touch marker>): what a hostile 'snapshot' would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def _write(tmp_path: Path, obj: Any, *, protocol: int = 4, compress: bool = False, name: str = "s") -> Path:
    data = pickle.dumps(obj, protocol=protocol)
    path = tmp_path / (f"{name}.pickle.gz" if compress else f"{name}.pickle")
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def _without_trace(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    if summary is None:
        return None
    return {k: v for k, v in summary.items() if k not in TRACE_FIELDS}


def _synthetic() -> dict[str, Any]:
    return graphed_run(num_replay_steps=4, leak_bytes=1 << 20)[2]


def test_real_fixtures_present() -> None:
    assert len(REAL) >= 13, REAL


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_fixture_segments_equal_full_load(path: Path) -> None:
    raw, traces_loaded = load_snapshot_segments(path)
    full = load_snapshot(path)
    assert traces_loaded is False
    assert raw["segments"] == full["segments"]
    assert raw["device_traces"] == []
    assert full["device_traces"]


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_fixture_triage_equal_but_trace(path: Path) -> None:
    fast = triage(path).to_dict()
    full = triage(path, with_trace=True).to_dict()
    assert fast["snapshot"]["num_trace_entries"] is None and fast["snapshot"]["phases"] is None
    assert isinstance(full["snapshot"]["num_trace_entries"], int)
    assert _without_trace(fast["snapshot"]) == _without_trace(full["snapshot"])


@pytest.mark.parametrize(("before", "after"), PAIRS)
def test_real_fixture_against_equal_but_trace(before: str, after: str) -> None:
    old, new = DATA / f"{before}.pickle.gz", DATA / f"{after}.pickle.gz"
    fast = triage(new, against=old, top=50).to_dict()
    full = triage(new, against=old, top=50, with_trace=True).to_dict()
    for key in ("snapshot", "against"):
        assert _without_trace(fast[key]) == _without_trace(full[key])
    assert fast["diff"] == full["diff"]
    assert fast["leak_suspects"] == full["leak_suspects"]


@pytest.mark.parametrize("compress", [False, True])
def test_synthetic_fast_path(tmp_path: Path, compress: bool) -> None:
    snap = _synthetic()
    raw, traces_loaded = load_snapshot_segments(_write(tmp_path, snap, compress=compress))
    assert traces_loaded is False and raw == {"segments": snap["segments"], "device_traces": []}


def _large_string_snapshot(where: str) -> dict[str, Any]:
    # Strings over the 64 KiB frame target are written outside any frame.
    snap = _synthetic()
    big = "x" * (100 << 10)
    if where == "segments":
        snap["segments"][0]["blocks"][0]["frames"] = [{"filename": big, "line": 1, "name": "f"}]
    else:
        snap["allocator_settings"]["note"] = big
    return snap


@pytest.mark.parametrize(
    "case",
    ["protocol2", "protocol5", "unframed_before_key", "unframed_after_key", "no_key", "key_order",
     "legacy_list", "key_string_in_segments", "nested_segments_dict"],
)
@pytest.mark.parametrize("compress", [False, True])
def test_fallback_to_full_load(tmp_path: Path, case: str, compress: bool) -> None:
    snap: Any = _synthetic()
    protocol = 4
    if case == "protocol2":
        protocol = 2
    elif case == "protocol5":
        protocol = 5
    elif case == "unframed_before_key":
        snap = _large_string_snapshot("segments")
    elif case == "unframed_after_key":
        snap = _large_string_snapshot("allocator_settings")
    elif case == "no_key":
        del snap["device_traces"]
    elif case == "key_order":
        snap = {"device_traces": snap["device_traces"], "segments": snap["segments"]}
    elif case == "legacy_list":
        snap = snap["segments"]
    elif case == "key_string_in_segments":
        # The first 'device_traces' string is inside a block, so the real key is a memo reference.
        snap["segments"][0]["blocks"][0]["frames"] = [{"filename": "device_traces", "line": 1, "name": "f"}]
    elif case == "nested_segments_dict":
        # Cut there, the prefix loads to this inner dict; only the memo-slot-0 check rejects it.
        snap["segments"].insert(0, {"segments": [1], "device_traces": 2})
    path = _write(tmp_path, snap, protocol=protocol, compress=compress)
    raw, traces_loaded = load_snapshot_segments(path)
    assert traces_loaded is True
    assert raw == load_snapshot(path)


@pytest.mark.parametrize("compress", [False, True])
def test_global_before_key_is_refused(tmp_path: Path, compress: bool) -> None:
    marker = tmp_path / "pwned"
    snap = {"segments": [{"evil": _RunsCommand(marker)}], "device_traces": [[]]}
    path = _write(tmp_path, snap, compress=compress)
    for load in (load_snapshot, load_snapshot_segments):
        with pytest.raises(InputFileError, match="nothing was executed"):
            load(path)
    assert not marker.exists()


@pytest.mark.parametrize("compress", [False, True])
def test_global_after_key_is_never_loaded_fast_and_refused_full(tmp_path: Path, compress: bool) -> None:
    marker = tmp_path / "pwned"
    segments = _synthetic()["segments"]
    snap = {"segments": segments, "device_traces": [[{"action": "alloc", "x": _RunsCommand(marker)}]],
            "allocator_settings": {}}
    path = _write(tmp_path, snap, compress=compress)
    raw, traces_loaded = load_snapshot_segments(path)
    assert traces_loaded is False and raw["segments"] == segments
    with pytest.raises(InputFileError, match="nothing was executed"):
        load_snapshot(path)
    with pytest.raises(InputFileError, match="nothing was executed"):
        triage(path, with_trace=True)
    assert not marker.exists()


def _multi_frame_bytes() -> bytes:
    data = gzip.decompress((DATA / "megatron" / "snapshot-local-d0.1-after_replays.pickle.gz").read_bytes())
    assert data.count(b"\x95") > 10 and data.index(b"\x8c\x0ddevice_traces\x94") < len(data) // 4
    return data


def _frame_ends(data: bytes) -> list[int]:
    pos, ends = 2, []
    while pos < len(data):
        pos += 9 + int.from_bytes(data[pos + 1:pos + 9], "little")
        ends.append(pos)
    return ends


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("cut", ["before_key", "half", "frame_end", "last_byte"])
def test_truncated_after_or_before_key(tmp_path: Path, compress: bool, cut: str) -> None:
    data = _multi_frame_bytes()
    ends = _frame_ends(data)
    assert ends[-1] == len(data)
    keep = {"before_key": 100, "half": len(data) // 2, "frame_end": ends[len(ends) // 2],
            "last_byte": len(data) - 1}[cut]
    path = tmp_path / "cut.pickle"
    path.write_bytes(gzip.compress(data[:keep]) if compress else data[:keep])
    with pytest.raises(InputFileError, match="truncated|not a valid"):
        load_snapshot_segments(path)


@pytest.mark.parametrize("damage", ["cut_stream", "flip_byte"])
def test_damaged_gzip_is_one_input_file_error(tmp_path: Path, damage: str) -> None:
    packed = bytearray(gzip.compress(_multi_frame_bytes()))
    if damage == "cut_stream":
        packed = packed[: len(packed) * 3 // 4]
    else:
        packed[len(packed) * 3 // 4] ^= 0xFF
    path = tmp_path / "bad.pickle.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(InputFileError, match="truncated|corrupt|not a valid"):
        load_snapshot_segments(path)


def test_decompressed_cap_applies_to_the_skipped_rest(tmp_path: Path) -> None:
    bomb = _write(tmp_path, {"segments": [], "device_traces": [["x" * 5_000_000]]}, compress=True)
    assert bomb.stat().st_size < 100_000
    with pytest.raises(InputFileError, match="decompressed size exceeds"):
        load_snapshot_segments(bomb, max_bytes=1_000_000)


def test_cli_text_and_json_say_trace_not_loaded(tmp_path: Path) -> None:
    path = _write(tmp_path, _synthetic())
    fast = CliRunner().invoke(main, ["triage", str(path), "--json", str(tmp_path / "fast.json")])
    full = CliRunner().invoke(main, ["triage", str(path), "--trace", "--json", str(tmp_path / "full.json")])
    assert fast.exit_code == 0 and full.exit_code == 0
    assert "trace not loaded" in fast.stdout and "--trace" in fast.stdout
    assert "trace not loaded" not in full.stdout and "trace entries" in full.stdout
    doc_fast = json.loads((tmp_path / "fast.json").read_text())
    doc_full = json.loads((tmp_path / "full.json").read_text())
    # schema 2 by design: the one envelope of docs/json.md
    assert doc_fast["schema_version"] == doc_full["schema_version"] == 2
    assert all(doc_fast["snapshot"][k] is None for k in TRACE_FIELDS)
    assert doc_full["snapshot"]["num_trace_entries"] > 0 and doc_full["snapshot"]["phases"]
    assert _without_trace(doc_fast["snapshot"]) == _without_trace(doc_full["snapshot"])


def test_html_loads_the_trace(tmp_path: Path) -> None:
    path = _write(tmp_path, _synthetic())
    report = triage(path, with_timeline=True)
    assert report.snapshot.trace_loaded and report.timeline is not None and report.timeline.num_events > 0
