"""Fast one-pass reader of PyTorch profiler (Kineto) Chrome traces, `.json` or `.json.gz`.

Keeps only the events launch accounting needs (annotations, CUDA runtime/driver calls, GPU
activities, `aten::fill_` ops); everything else is dropped in the same pass. Pure Python, no torch.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass, field
from typing import Any

from graphdoctor.errors import InputFileError

Event = dict[str, Any]
"""One Chrome-trace event exactly as Kineto wrote it (`ph`, `cat`, `name`, `ts`, `dur`, `args`...)."""

HOST_LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
ANNOTATION_CATEGORIES = frozenset({"user_annotation", "cpu_op"})
PROFILER_STEP_PREFIX = "ProfilerStep#"
PHASE_PREFIX = "graphdoctor/"
FILL_OP_NAME = "aten::fill_"


@dataclass(slots=True)
class TraceEvents:
    """The subset of a trace that launch accounting reads, bucketed by role.

    The lists hold the original event dicts (no copies), in file order.
    """

    path: str
    """Where the trace came from (for reports)."""
    num_events: int = 0
    """Number of entries in `traceEvents`, all categories."""
    annotations: list[Event] = field(default_factory=list)
    """`ProfilerStep#N` and `graphdoctor/<impl>/<phase>/<step>` CPU ranges."""
    host_calls: list[Event] = field(default_factory=list)
    """Every `cuda_runtime` / `cuda_driver` event (launch APIs are picked out later)."""
    gpu_kernels: list[Event] = field(default_factory=list)
    """`kernel` events."""
    gpu_memops: list[Event] = field(default_factory=list)
    """`gpu_memcpy` and `gpu_memset` events."""
    fill_ops: list[Event] = field(default_factory=list)
    """`aten::fill_` CPU ops; their `External id` marks RNG-prologue fills."""


def load_trace_document(path: str | os.PathLike[str]) -> Any:
    """Read and decode a Chrome trace file; gzip is detected by its magic bytes, not the suffix.

    Args:
        path: A `.json` or `.json.gz` trace as written by `torch.profiler` `export_chrome_trace`.

    Returns:
        The decoded JSON document (a dict with `traceEvents`, or a bare event list).

    Raises:
        InputFileError: The file is missing, unreadable, not gzip/JSON, or truncated.
    """
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise InputFileError(f"trace: cannot read {os.fspath(path)!r}: {exc.strerror}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputFileError(f"trace: {os.fspath(path)!r} is not a valid gzip file: {exc}") from exc
    try:
        # json.loads on bytes is the C decoder end to end; it is the floor we are measured against.
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputFileError(
            f"trace: {os.fspath(path)!r} is not Chrome-trace JSON (got a parse error: {exc}); "
            "expected the output of torch.profiler export_chrome_trace"
        ) from exc


def read_trace(path: str | os.PathLike[str]) -> TraceEvents:
    """Load a Kineto Chrome trace and keep only the events launch accounting needs.

    Args:
        path: A `.json` or `.json.gz` trace.

    Returns:
        TraceEvents with the annotation, host-call, GPU-activity and fill-op buckets filled.

    Raises:
        InputFileError: The file cannot be read or has no `traceEvents` list.
    """
    document = load_trace_document(path)
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise InputFileError(
            f"trace: {os.fspath(path)!r} has no 'traceEvents' list; "
            "expected a torch.profiler Chrome trace"
        )
    return bucket_events(events, path=os.fspath(path))


def bucket_events(events: list[Event], *, path: str = "<memory>") -> TraceEvents:
    """Split raw trace events into the buckets of TraceEvents in one tight pass.

    Args:
        events: The `traceEvents` list.
        path: Label recorded in the result.

    Returns:
        TraceEvents referencing the kept event dicts.
    """
    result = TraceEvents(path=path, num_events=len(events))
    cpu_ops: list[Event] = []
    user_annotations: list[Event] = []
    # One dict lookup per event decides its bucket; names are only looked at for the small
    # annotation/cpu_op bucket afterwards. This keeps the per-event cost near a bare loop.
    buckets = {
        "cuda_runtime": result.host_calls,
        "cuda_driver": result.host_calls,
        "kernel": result.gpu_kernels,
        "gpu_memcpy": result.gpu_memops,
        "gpu_memset": result.gpu_memops,
        "user_annotation": user_annotations,
        "cpu_op": cpu_ops,
    }
    get_bucket = buckets.get
    for event in events:
        bucket = get_bucket(event.get("cat", ""))
        if bucket is not None:
            bucket.append(event)
    # cpu_op is the largest bucket; comprehensions keep these scans at C-loop speed.
    result.fill_ops = [e for e in cpu_ops if e.get("name") == FILL_OP_NAME]
    prefixes = (PHASE_PREFIX, PROFILER_STEP_PREFIX)
    steps_as_ops = [e for e in cpu_ops if e.get("name", "").startswith(PROFILER_STEP_PREFIX)]
    result.annotations = [
        e
        for e in user_annotations + steps_as_ops
        if e.get("name", "").startswith(prefixes) and e.get("ph", "X") == "X"
    ]
    return result


__all__ = [
    "ANNOTATION_CATEGORIES",
    "Event",
    "GPU_CATEGORIES",
    "HOST_LAUNCH_CATEGORIES",
    "TraceEvents",
    "bucket_events",
    "load_trace_document",
    "read_trace",
]
