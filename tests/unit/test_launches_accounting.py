"""Launch accounting on the SYNTHETIC Kineto-format trace (fixtures/data/launches/make_synthetic.py).

The synthetic trace is hand-built in Kineto's layout; the real H200 trace is covered by
test_launches_real.py.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from graphdoctor.errors import UsageError
from graphdoctor.launches import (
    LaunchCount,
    account_events,
    account_trace,
    classify_host_call,
    merge_counts,
)
from graphdoctor.launches.trace import bucket_events

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "launches"
SYNTHETIC = DATA / "synthetic_kineto_trace.json"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_synthetic", DATA / "make_synthetic.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_synthetic_trace_is_up_to_date() -> None:
    assert json.loads(SYNTHETIC.read_text()) == _generator().build()


@pytest.mark.parametrize("phase", ["eager", "replay"])
def test_phase_figures_match_expected(phase: str) -> None:
    accounting = account_trace(SYNTHETIC)
    record = accounting.phase("toy", phase)
    assert record is not None
    got = record.to_dict()
    for key, want in _generator().EXPECTED[phase].items():
        assert got[key] == want, key


def test_total_and_steps() -> None:
    accounting = account_trace(SYNTHETIC)
    total = accounting.total
    assert total.num_gpu_kernels_unattributed == _generator().EXPECTED["total_unattributed"]
    assert [s.label for s in accounting.steps] == ["ProfilerStep#0", "ProfilerStep#1"]
    assert [s.step for s in accounting.steps] == ["0", "1"]
    assert sum(s.num_host_launches for s in accounting.steps) == total.num_host_launches
    assert total.num_steps == 2
    assert total.host_time_us == pytest.approx(sum(s.host_time_us for s in accounting.steps))
    assert 0.0 < total.graph_coverage < 1.0


def test_user_fill_not_before_a_graph_launch_is_not_prologue() -> None:
    eager = account_trace(SYNTHETIC).phase("toy", "eager")
    assert eager is not None and eager.num_prologue_fill_launches == 0


def test_fill_between_prologue_and_graph_breaks_chain() -> None:
    # fill, copy kernel, graph launch: the fill is not a prologue fill (a launch came in between)
    events = _chain(["fill", "copy", "graph"])
    record = account_events(bucket_events(events)).total
    assert record.num_prologue_fill_launches == 0
    record = account_events(bucket_events(_chain(["copy", "fill", "fill", "graph"]))).total
    assert record.num_prologue_fill_launches == 2
    assert record.kernels_per_graph_launch == (3,)


def _chain(kinds: list[str]) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    for i, kind in enumerate(kinds):
        corr = 10 + i
        api = "cudaGraphLaunch" if kind == "graph" else "cudaLaunchKernel"
        events.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": 1, "tid": 1,
                       "ts": 100.0 + 10 * i, "dur": 2.0, "args": {"External id": i, "correlation": corr}})
        if kind == "fill":
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::fill_", "pid": 1, "tid": 1,
                           "ts": 99.0 + 10 * i, "dur": 5.0, "args": {"External id": i}})
        for _ in range(3 if kind == "graph" else 1):
            events.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
                           "ts": 500.0 + i, "dur": 1.0, "args": {"correlation": corr}})
    return events


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("cudaLaunchKernel", "kernel"),
        ("cudaLaunchKernelExC_v11060", "kernel"),
        ("cuLaunchKernelEx", "kernel"),
        ("cudaGraphLaunch", "graph"),
        ("cudaMemcpyAsync", "memcpy"),
        ("cuMemsetD32Async", "memset"),
        ("cudaStreamIsCapturing", None),
        ("cudaGraphInstantiate", None),
    ],
)
def test_classify_host_call(name: str, kind: str | None) -> None:
    assert classify_host_call(name) == kind


def test_merge_counts_sums_and_keeps_agreeing_meta() -> None:
    a = LaunchCount(label="a", impl="x", phase="replay", launch_calls={"cudaGraphLaunch": 2},
                    num_graph_launches=2, kernels_per_graph_launch=(3, 4), host_time_us=10.0)
    b = LaunchCount(label="b", impl="x", phase="replay", launch_calls={"cudaGraphLaunch": 1},
                    num_graph_launches=1, kernels_per_graph_launch=(3,), host_time_us=5.0)
    merged = merge_counts([a, b], label="m")
    assert (merged.impl, merged.phase, merged.num_steps) == ("x", "replay", 2)
    assert merged.launch_calls == {"cudaGraphLaunch": 3}
    assert merged.kernels_per_graph_launch == (3, 4, 3)
    assert merged.host_time_us == 15.0
    with pytest.raises(UsageError, match="at least one"):
        merge_counts([], label="none")


def test_to_dict_schema_is_json_and_versioned() -> None:
    document = account_trace(SYNTHETIC).to_dict()
    assert document["schema_version"] == 1
    assert set(document) == {"schema_version", "source", "num_events", "total", "steps", "phases", "tables"}
    json.dumps(document)
    table = document["tables"][0]
    assert table["impl"] == "toy" and table["eager"]["phase"] == "eager" and table["graphed"]["phase"] == "replay"


def test_trace_without_annotations_is_one_slice() -> None:
    events = _chain(["fill", "graph"])
    accounting = account_events(bucket_events(events))
    assert accounting.steps == () and accounting.phases == () and accounting.tables == ()
    assert accounting.total.host_time_us == pytest.approx(12.0)


def test_accounting_does_not_import_torch() -> None:
    code = "import sys, graphdoctor.launches, graphdoctor.cli.count; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
