"""Trace reader: .json and .json.gz give the same buckets; bad input is one clear error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from graphdoctor.errors import InputFileError
from graphdoctor.launches.trace import bucket_events, read_trace

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "launches"
SYNTHETIC = DATA / "synthetic_kineto_trace.json"


def test_buckets_keep_only_what_accounting_reads() -> None:
    trace = read_trace(SYNTHETIC)
    assert trace.num_events == len(json.loads(SYNTHETIC.read_text())["traceEvents"])
    assert {e["cat"] for e in trace.host_calls} == {"cuda_runtime", "cuda_driver"}
    assert {e["cat"] for e in trace.gpu_kernels} == {"kernel"}
    assert {e["cat"] for e in trace.gpu_memops} == {"gpu_memcpy", "gpu_memset"}
    names = sorted(e["name"] for e in trace.annotations)
    assert names == ["ProfilerStep#0", "ProfilerStep#1", "graphdoctor/toy/eager/0", "graphdoctor/toy/replay/1"]
    assert all(e["name"] == "aten::fill_" for e in trace.fill_ops) and len(trace.fill_ops) == 5


def test_gzip_is_detected_by_content(tmp_path: Path) -> None:
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(SYNTHETIC.read_bytes()))
    odd_name = tmp_path / "trace.data"
    odd_name.write_bytes(packed.read_bytes())
    plain = read_trace(SYNTHETIC)
    for path in (packed, odd_name):
        zipped = read_trace(path)
        assert zipped.num_events == plain.num_events
        assert zipped.host_calls == plain.host_calls


def test_bare_event_list_is_accepted() -> None:
    events = json.loads(SYNTHETIC.read_text())["traceEvents"]
    assert len(bucket_events(events).gpu_kernels) == len(read_trace(SYNTHETIC).gpu_kernels)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"foo": 1}', "no 'traceEvents' list"),
        (b"\x1f\x8bgarbage", "not a valid gzip"),
    ],
)
def test_bad_files_raise_input_file_error(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=match):
        read_trace(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no such file"):
        read_trace(tmp_path / "absent.json")
