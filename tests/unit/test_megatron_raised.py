"""An exception Megatron's own CUDA-graph code raises while creating the graphs (not a CUDA capture error) is
located at Megatron's frame, with its source line when it has no message, and gets no culprit hunt: the
frames are those recorded on two H200s (P=2, `local`, /work/gpu/evidence mg_reports/multi_gpu_pp2_dropout0)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import megatron.core.transformer.cuda_graphs as megatron_graphs
import pytest

from graphdoctor.child.entry import _message
from graphdoctor.compare.verdict import ImplResult
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffRun
from graphdoctor.parent.diagnose import diagnose, megatron_frame
from graphdoctor.types import Verdict
from tests.unit.sessions import DeferredSession

SITE = "/tmp/site"  # where megatron-core was installed on the H200 machine
H200_PP2_FRAMES = [
    ("/work/graphdoctor/child/entry.py", 219, "run"),
    ("/work/graphdoctor/child/entry.py", 106, "train"),
    ("/work/graphdoctor/child/loop.py", 300, "run_steps"),
    ("/work/graphdoctor/child/loop.py", 225, "train_step"),
    (f"{SITE}/megatron/core/pipeline_parallel/schedules.py", 2473, "forward_backward_pipelining_without_interleaving"),
    (f"{SITE}/megatron/core/transformer/cuda_graphs.py", 678, "create_cudagraphs"),
    (f"{SITE}/megatron/core/transformer/cuda_graphs.py", 536, "create_cudagraphs"),
    (f"{SITE}/megatron/core/transformer/cuda_graphs.py", 617, "_create_cudagraphs"),
]
H200_ITEM_MESSAGE = ("CUDA error: operation not permitted when stream is capturing\nCUDA kernel errors might be "
                     "asynchronously reported at some other API call")


def test_megatrons_own_assertion_is_located_at_its_frame_with_its_meaning() -> None:
    message = "assert fwd_buffer_reuse_ref_count == 0 (the source line: raised without a message)"
    diag = diagnose("AssertionError", message, H200_PP2_FRAMES, step=0, phase="capture")
    assert diag.location == "megatron/core/transformer/cuda_graphs.py:617"
    assert diag.meaning is not None and "_create_cudagraphs" in diag.meaning
    assert "not a CUDA capture error" in diag.meaning
    assert (diag.rule, diag.cuda_error) == (None, None)
    assert diag.message.startswith("assert fwd_buffer_reuse_ref_count == 0")
    # this assertion's reading, from the two H200 runs that captured and matched (one micro-batch; no mask)
    assert "shared by every micro-batch" in diag.meaning and "1F1B records B0 before F1" in diag.meaning
    assert diag.fix is not None and diag.fix.startswith("Give every micro-batch its own input tensors")


def test_an_assertion_without_a_known_reading_gets_no_fix() -> None:
    diag = diagnose("AssertionError", "assert runner.fwd_graph_recorded", H200_PP2_FRAMES, step=0, phase="capture")
    assert diag.meaning is not None and "Megatron's own" in diag.meaning and "micro-batch" not in diag.meaning
    assert diag.fix is None


def test_a_cuda_error_raised_from_a_megatron_frame_is_still_a_capture_error() -> None:
    diag = diagnose("AcceleratorError", H200_ITEM_MESSAGE, H200_PP2_FRAMES, step=0, phase="capture")
    assert diag.cuda_error == "cudaErrorStreamCaptureUnsupported"
    assert diag.location is None  # no user frame: the culprit hunt finds the operation
    assert diag.meaning is not None and "Megatron's own" not in diag.meaning


def test_outside_capture_or_outside_megatron_nothing_changes() -> None:
    assert diagnose("AssertionError", "", H200_PP2_FRAMES[:4], step=0, phase="replay").location is None
    assert megatron_frame(H200_PP2_FRAMES[:4]) is None
    eager = [*H200_PP2_FRAMES[:4], (f"{SITE}/megatron/core/transformer/attention.py", 10, "forward")]
    assert diagnose("AssertionError", "x", eager, step=0, phase="replay").location is None


class NoHuntSession(DeferredSession):
    """A session whose every child request is recorded (the hunt would be one)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.config = DiffConfig(impls=("local",), dropout=0.0)
        self.requests: list[object] = []

    def run_request(self, request: object) -> object:
        self.requests.append(request)
        raise AssertionError("the culprit hunt ran for a Python assertion")


def test_no_culprit_hunt_for_an_exception_megatron_raised(tmp_path: Path) -> None:
    diag = diagnose("AssertionError", "rank 1: assert fwd_buffer_reuse_ref_count == 0", H200_PP2_FRAMES, step=0,
                    phase="capture")
    row = ImplResult(impl="local", verdict=Verdict.CAPTURE_FAILED, diagnosis=diag)
    session = NoHuntSession(tmp_path)
    assert DiffRun(session).tree.hunt_culprit(row, "local") == row  # type: ignore[arg-type]
    assert session.requests == []


def test_a_bare_assert_gets_its_source_line_as_message(tmp_path: Path) -> None:
    source = tmp_path / "graphs_like.py"
    source.write_text("def create(count: int) -> None:\n    assert count == 0\n")
    spec = importlib.util.spec_from_file_location("graphs_like", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(AssertionError) as raised:
        module.create(1)
    assert _message(raised.value) == "assert count == 0 (the source line: raised without a message)"
    assert _message(ValueError("kept")) == "kept"


def test_the_h200_line_is_megatrons_assertion_in_the_installed_megatron() -> None:
    import linecache

    path = megatron_graphs.__file__
    assert linecache.getline(path, 617).strip() == "assert fwd_buffer_reuse_ref_count == 0"
    assert sys.modules["megatron.core.transformer.cuda_graphs"] is megatron_graphs
