"""Error messages seen on the H200 turned into diagnoses."""

from __future__ import annotations

import os

import pytest

from graphdoctor.parent.diagnose import diagnose, is_capture_error, is_user_frame, user_location

# Messages as torch 2.11 printed them on the H200 (see ../shared/notes/h200-findings.md).
IMPLICIT = ("CUDA error: operation would make the legacy stream depend on a capturing blocking "
            "stream\nSearch for `cudaErrorStreamCaptureImplicit' in https://docs.nvidia.com/...")
INVALIDATED = ("CUDA error: operation failed due to a previous error during capture\nSearch for "
               "`cudaErrorStreamCaptureInvalidated' ...")
UNSUPPORTED = "CUDA error: operation not permitted when stream is capturing"

TORCH = os.path.join(os.sep, "x", "site-packages", "torch", "autograd", "__init__.py")
MEGATRON = os.path.join(os.sep, "x", "site-packages", "megatron", "core", "transformer",
                        "cuda_graphs.py")
USER = os.path.join(os.sep, "work", "proj", "fixtures", "planted", "item_mlp.py")


@pytest.mark.parametrize(("message", "name", "rule"), [
    (IMPLICIT, "cudaErrorStreamCaptureImplicit", "GD503"),
    (INVALIDATED, "cudaErrorStreamCaptureInvalidated", "GD510"),
    (UNSUPPORTED, "cudaErrorStreamCaptureUnsupported", "GD501"),
])
def test_cuda_error_names(message: str, name: str, rule: str) -> None:
    diag = diagnose("AcceleratorError", message, [])
    assert diag.cuda_error == name
    assert diag.rule == rule
    assert diag.meaning and diag.fix
    assert diag.message == message.splitlines()[0]


def test_user_location_is_innermost_user_frame() -> None:
    frames = [(USER.replace("item_mlp", "train"), 10, "main"), (MEGATRON, 1305, "create_fwd_graph"),
              (USER, 42, "forward"), (TORCH, 7, "item")]
    diag = diagnose("AcceleratorError", UNSUPPORTED, frames, module="decoder.layers.0.mlp",
                    step=0, phase="capture")
    assert diag.location is not None and diag.location.endswith("item_mlp.py:42")
    assert diag.module == "decoder.layers.0.mlp"
    assert len(diag.traceback_tail) == 4


def test_library_only_stack_has_no_location() -> None:
    assert user_location([(TORCH, 1, "f"), (MEGATRON, 2, "g")]) is None


def test_frame_classification() -> None:
    assert is_user_frame(USER)
    assert not is_user_frame(TORCH)
    assert not is_user_frame("<frozen runpy>")
    assert not is_user_frame(os.__file__)


def test_capture_detection_by_stack_and_message() -> None:
    assert is_capture_error("RuntimeError", "boom", [(MEGATRON, 1, "create_bwd_graph")])
    assert is_capture_error("AcceleratorError", UNSUPPORTED, [])
    assert not is_capture_error("RuntimeError", "boom", [(USER, 1, "forward")])


def test_unknown_error_keeps_first_line() -> None:
    diag = diagnose("ValueError", "\n  bad thing\nmore", [])
    assert diag.message == "bad thing"
    assert diag.cuda_error is None and diag.fix is None
