"""Safe snapshot loading: hostile pickles execute nothing, bad files give one InputFileError."""

from __future__ import annotations

import gzip
import os
import pickle
import pickletools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphdoctor.errors import InputFileError
from graphdoctor.memory.loader import load_snapshot, loads_snapshot, save_snapshot
from graphdoctor.memory.synthetic import SnapshotBuilder

_FRAMES = [("/w/train.py", 3, "main")]


def _snapshot() -> dict:
    builder = SnapshotBuilder()
    builder.set_phase("eager")
    builder.alloc(4096, frames=_FRAMES)
    return builder.build()


class _RunsCommand:
    """Pickles to os.system(<touch marker>): what a hostile 'snapshot' would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_round_trip_plain_and_gzip(tmp_path: Path) -> None:
    snap = _snapshot()
    plain = save_snapshot(snap, tmp_path / "s.pickle")
    zipped = save_snapshot(snap, tmp_path / "s.pickle.gz")
    assert zipped.read_bytes()[:2] == b"\x1f\x8b"
    assert load_snapshot(plain) == snap
    assert load_snapshot(zipped) == snap
    # gzip is detected from content, not from the name
    renamed = tmp_path / "renamed.pickle"
    renamed.write_bytes(zipped.read_bytes())
    assert load_snapshot(renamed) == snap


def test_real_layout_needs_no_globals() -> None:
    data = pickle.dumps(_snapshot(), protocol=4)
    opcodes = {op.name for op, _, _ in pickletools.genops(data)}
    assert not opcodes & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ"}


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize("compress", [False, True])
def test_command_pickle_is_refused_and_not_run(tmp_path: Path, protocol: int, compress: bool) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"segments": [], "x": _RunsCommand(marker)}, protocol=protocol)
    path = tmp_path / "evil.pickle"
    path.write_bytes(gzip.compress(payload) if compress else payload)
    with pytest.raises(InputFileError, match="nothing was executed"):
        load_snapshot(path)
    assert not marker.exists()


def test_class_instance_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "obj.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "p": Path("/etc")}))
    with pytest.raises(InputFileError, match="refused global"):
        load_snapshot(path)


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.99])
def test_truncated_file(tmp_path: Path, keep: float) -> None:
    data = pickle.dumps(_snapshot(), protocol=4)
    path = tmp_path / "cut.pickle"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(InputFileError, match="truncated|not a valid"):
        load_snapshot(path)


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(pickle.dumps(_snapshot(), protocol=4))
    path = tmp_path / "cut.pickle.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputFileError, match="truncated|not a valid"):
        load_snapshot(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"this is not a pickle at all", "not a valid snapshot pickle"),
        (pickle.dumps([1, 2, 3]), None),
        (pickle.dumps("text"), "top level is str"),
        (pickle.dumps({"device_traces": []}), "'segments' missing"),
    ],
)
def test_malformed(tmp_path: Path, content: bytes, message: str | None) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    if message is None:
        # a bare list is a legacy segment list; wrapped, not rejected
        assert load_snapshot(path) == {"segments": [1, 2, 3], "device_traces": []}
        return
    with pytest.raises(InputFileError, match=message):
        load_snapshot(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no such file"):
        load_snapshot(tmp_path / "nope.pickle")
    with pytest.raises(InputFileError, match="not a regular file"):
        load_snapshot(tmp_path)


def test_size_cap_plain_and_decompressed(tmp_path: Path) -> None:
    plain = save_snapshot(_snapshot(), tmp_path / "s.pickle")
    with pytest.raises(InputFileError, match="exceeds the cap"):
        load_snapshot(plain, max_bytes=100)
    bomb = tmp_path / "bomb.pickle.gz"
    bomb.write_bytes(gzip.compress(pickle.dumps({"segments": [], "pad": "x" * 5_000_000})))
    assert bomb.stat().st_size < 100_000
    with pytest.raises(InputFileError, match="decompressed size exceeds"):
        load_snapshot(bomb, max_bytes=1_000_000)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_input_file_error(data: bytes) -> None:
    """Smoke test by design: any exception other than InputFileError (or a hang) fails it."""
    try:
        loads_snapshot(data)
    except InputFileError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=400))
def test_every_truncation_is_an_input_file_error(cut: int) -> None:
    data = pickle.dumps(_snapshot(), protocol=4)
    with pytest.raises(InputFileError):
        loads_snapshot(data[: min(cut, len(data) - 1)])
