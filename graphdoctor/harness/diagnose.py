"""Turn an exception from a child run into a Diagnosis: CUDA error name, meaning, fix, user file:line.

Pure Python over plain frame tuples, so it is tested on CPU with recorded messages from the H200.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass

from graphdoctor.types import Diagnosis

Frame = tuple[str, int, str]
"""(filename, line, function) of one traceback frame, outermost first."""


@dataclass(frozen=True, slots=True)
class KnownError:
    """A recognisable error message and what to tell the user about it."""

    pattern: str
    """Substring of the error message (case-sensitive)."""

    cuda_error: str | None
    """CUDA error name, when it is one."""

    meaning: str
    """Plain-language meaning."""

    fix: str
    """What to do."""

    rule: str | None = None
    """Code in the checks catalogue."""


KNOWN_ERRORS: tuple[KnownError, ...] = (
    KnownError(
        "operation not permitted when stream is capturing", "cudaErrorStreamCaptureUnsupported",
        "an operation that cannot be captured ran while the stream was capturing (a host sync such "
        "as .item(), .cpu(), .tolist(), bool(tensor), nonzero or torch.cuda.synchronize)",
        "Move the host read before capture or keep the value on the device", "GD501"),
    KnownError(
        "operation failed due to a previous error during capture", "cudaErrorStreamCaptureInvalidated",
        "the capture had already been invalidated by an earlier unsupported operation; this call "
        "site is not the culprit", "Run `graphdoctor check --probe` to find the first unsafe operation",
        "GD510"),
    KnownError(
        "operation would make the legacy stream depend on a capturing blocking stream",
        "cudaErrorStreamCaptureImplicit",
        "work on the legacy default stream met the capturing stream; with full_iteration this is "
        "DDP built off the capture stream (AccumulateGrad nodes on another stream)",
        "Build Megatron DDP under torch.cuda.stream(get_shared_capture_stream()) or use a torch "
        "with torch.autograd.graph.set_override_stale_capture_stream", "GD503"),
    KnownError(
        "capture was not ended in the same stream as it began", "cudaErrorStreamCaptureUnmatched",
        "capture began and ended on different streams", "End the capture on the stream that began it"),
    KnownError(
        "capturing stream has unjoined work", "cudaErrorStreamCaptureUnjoined",
        "a side stream forked from the capturing stream was not joined back before capture ended",
        "Make the capturing stream wait on every side stream before the capture ends"),
    KnownError(
        "dependency created on uncaptured work in another stream", "cudaErrorStreamCaptureIsolation",
        "captured work waited on an event recorded outside the capture",
        "Record the event inside the captured region or synchronise before capture"),
    KnownError(
        "Attempt to increase offset for a CUDA generator not in capture mode", None,
        "a random op used a CUDA generator that is not registered with the graph",
        "Register the generator with graph.register_generator_state() or draw from Megatron's "
        "graph-safe RNG tracker", "GD505"),
    KnownError(
        "has no attribute 'main_grad'", None,
        "the local implementation adds weight gradients into param.main_grad, which Megatron DDP "
        "creates", "Wrap the model in megatron.core.distributed.DistributedDataParallel"),
    KnownError(
        "RNG tracker does not support cudagraphs", None,
        "the RNG tracker is not graph-safe",
        "Call model_parallel_cuda_manual_seed(..., use_cudagraphable_rng=True, "
        "force_reset_rng=True) before building the model"),
    KnownError(
        "CUDA graph argument mismatch", None,
        "a graphed layer was called with a different shape, dtype or non-tensor argument than at "
        "capture", "Keep sequence length, micro-batch size and argument types fixed"),
    KnownError(
        "no matching cudagraph runners", None,
        "no captured graph matches the call (different shapes or training mode)",
        "Keep shapes and training mode fixed between capture and replay"),
    KnownError(
        "called a synchronizing CUDA operation", None,
        "a synchronizing operation ran under torch.cuda.set_sync_debug_mode('error')",
        "Move the host read before capture or keep the value on the device", "GD501"),
    KnownError(
        "out of memory", "cudaErrorMemoryAllocation",
        "the GPU ran out of memory (graphs pin every intermediate buffer for the life of the graph)",
        "Reduce micro-batch size or graph scope, or run `graphdoctor triage` on a snapshot"),
)

_LIBRARY_MARKERS = (
    f"{os.sep}torch{os.sep}", f"{os.sep}megatron{os.sep}", f"{os.sep}transformer_engine{os.sep}",
    f"{os.sep}graphdoctor{os.sep}", f"{os.sep}nvtx{os.sep}", f"{os.sep}apex{os.sep}",
    f"{os.sep}click{os.sep}", f"{os.sep}_pytest{os.sep}", f"{os.sep}pluggy{os.sep}",
)
_STDLIB_DIRS = tuple(
    d for d in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")} if d
)


def is_user_frame(filename: str) -> bool:
    """True for frames from the user's code: not torch, megatron, TE, graphdoctor nor the stdlib."""
    if filename.startswith("<"):
        return False
    norm = os.path.normpath(filename)
    if any(marker in norm for marker in _LIBRARY_MARKERS):
        return False
    return not any(norm.startswith(d + os.sep) for d in _STDLIB_DIRS)


def user_location(frames: list[Frame]) -> str | None:
    """`file:line` of the innermost user frame, or None when the stack is all library code."""
    for filename, line, _ in reversed(frames):
        if is_user_frame(filename):
            return f"{_short_path(filename)}:{line}"
    return None


def _short_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def match_known(message: str) -> KnownError | None:
    """The first known error whose pattern occurs in `message`."""
    for known in KNOWN_ERRORS:
        if known.pattern in message:
            return known
    return None


def is_capture_error(error_type: str, message: str, frames: list[Frame]) -> bool:
    """True when the failure happened while capturing (by message or by the functions on the stack)."""
    known = match_known(message)
    if known is not None and known.cuda_error and "Capture" in known.cuda_error:
        return True
    capture_functions = {"create_fwd_graph", "create_bwd_graph", "_create_cudagraphs",
                         "capture_begin", "capture_end", "make_graphed_callables",
                         "_make_graphed_callables", "create_cudagraphs"}
    return any(fn in capture_functions for _, _, fn in frames)


def diagnose(
    error_type: str,
    message: str,
    frames: list[Frame],
    *,
    module: str | None = None,
    step: int | None = None,
    phase: str | None = None,
) -> Diagnosis:
    """Build a Diagnosis from an exception's type, message and frames (outermost first).

    Args:
        error_type: exception class name.
        message: full exception message.
        frames: traceback frames, outermost first.
        module: qualified name of the innermost module on the stack, when known.
        step: step at which it failed.
        phase: phase at which it failed.

    Returns:
        The diagnosis with CUDA error name, meaning and fix where the message is recognised, and the
        user's file:line when the stack reaches user code.
    """
    known = match_known(message)
    first_line = next((ln.strip() for ln in message.splitlines() if ln.strip()), error_type)
    tail = [f"{_short_path(f)}:{ln} in {fn}" for f, ln, fn in frames[-8:]]
    return Diagnosis(
        error_type=error_type,
        message=first_line[:400],
        cuda_error=known.cuda_error if known else None,
        meaning=known.meaning if known else None,
        fix=known.fix if known else None,
        rule=known.rule if known else None,
        module=module,
        location=user_location(frames),
        step=step,
        phase=phase,
        traceback_tail=tail,
    )


__all__ = ["KNOWN_ERRORS", "Frame", "KnownError", "diagnose", "is_capture_error",
           "is_user_frame", "match_known", "user_location"]
