"""graphdoctor.inputs: regular files only, caps, strict JSON, bounded trees, atomic writes."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from graphdoctor.errors import InputFileError, UsageError
from graphdoctor.inputs import (
    check_tree,
    gzip_cap,
    loads_json,
    read_bytes,
    read_json,
    read_text,
    write_output,
)

REPO = Path(__file__).resolve().parents[2]


def test_non_regular_files_are_refused_by_type(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match=r"not a regular file \(a FIFO\)"):
        read_bytes(fifo, "trace", max_bytes=10)
    with pytest.raises(InputFileError, match=r"not a regular file \(a character device\)"):
        read_bytes("/dev/zero", "trace", max_bytes=10)
    with pytest.raises(InputFileError, match=r"not a regular file \(a directory\)"):
        read_text(tmp_path, "run file")
    with pytest.raises(InputFileError, match="no such file"):
        read_text(tmp_path / "absent", "run file")


def test_size_and_decompression_caps(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"x" * 100)
    with pytest.raises(InputFileError, match="exceeds the cap of 99 bytes"):
        read_bytes(plain, "trace", max_bytes=99, flag="--max-bytes")
    assert read_bytes(plain, "trace", max_bytes=100) == b"x" * 100
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (1 << 20)))
    with pytest.raises(InputFileError, match="decompressed size exceeds the cap"):
        read_bytes(bomb, "trace", max_bytes=1 << 19)
    mib = 1 << 20
    assert gzip_cap(1000, 1 << 40, 64) == 64 * mib  # the floor
    assert gzip_cap(10 * mib, 1 << 40, 64) == 640 * mib and gzip_cap(10 * mib, 100, 64) == 100
    assert gzip_cap(10 * mib, 1 << 40, None) == 1 << 40
    assert len(read_bytes(bomb, "trace", max_bytes=1 << 20)) == 1 << 20


def test_strict_json() -> None:
    assert loads_json(b'{"a": [1, 2.5, "x"]}', "t") == {"a": [1, 2.5, "x"]}
    for bad in (b'{"dur": NaN}', b"[Infinity]", b"[-Infinity]", b"[" * 100_000, b"{", b"\xff"):
        with pytest.raises(InputFileError):
            loads_json(bad, "t")


def test_saved_diff_reports_read_strictly() -> None:
    for path in sorted((REPO / "fixtures" / "data" / "diff").glob("*.json")):
        assert read_json(path, "report")["schema_version"] >= 1


def test_check_tree_bounds_depth_cycles_and_expansion() -> None:
    assert check_tree({"a": [1, 2, {"b": 3}]}, "t", max_nodes=100) == 8  # dict, key, list, 1, 2, dict, key, 3
    shared: list[object] = [1]
    for _ in range(100):
        shared = [shared, shared]
    with pytest.raises(InputFileError, match="expands to more than"):
        check_tree(shared, "t", max_nodes=10**6, max_depth=1000)
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(InputFileError, match="reference cycle"):
        check_tree(cycle, "t", max_nodes=100)
    deep: list[object] = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(InputFileError, match="nested deeper"):
        check_tree(deep, "t", max_nodes=10**6)


def test_write_output_is_atomic_and_never_onto_an_input(tmp_path: Path) -> None:
    source = tmp_path / "snap"
    source.write_bytes(b"data")
    with pytest.raises(UsageError, match="is an input"):
        write_output(tmp_path / "." / "snap", "report", flag="--json", inputs=[source])
    link = tmp_path / "link"
    link.symlink_to(source)
    with pytest.raises(UsageError, match="is an input"):
        write_output(link, "report", flag="--json", inputs=[source])
    assert source.read_bytes() == b"data"
    target = tmp_path / "out.json"
    target.write_text("old")
    target.chmod(0o640)
    write_output(target, "new", inputs=[source])
    assert target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "out.json", "snap"]  # no temp file left
    write_output(os.devnull, "discarded")
    with pytest.raises(UsageError, match="is a directory"):
        write_output(tmp_path, "x")


def test_escape_control_keeps_layout_and_shows_controls() -> None:
    from graphdoctor.report.escape import escape_control

    assert escape_control("a\tb\nc") == "a\tb\nc"
    assert escape_control("\x1b]0;x\x07") == "\\x1b]0;x\\x07"
