"""Fast one-pass reader of PyTorch profiler (Kineto) Chrome traces, `.json` or `.json.gz`.

Keeps only the events launch accounting needs (annotations, CUDA runtime/driver calls, GPU
activities, `aten::fill_` ops); everything else is dropped in the same pass. Pure Python, no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from graphdoctor.errors import InputFileError
from graphdoctor.inputs import MAX_GZIP_RATIO, MAX_TRACE_BYTES, loads_json, read_bytes, type_error

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


def load_trace_document(path: str | os.PathLike[str], *, max_bytes: int = MAX_TRACE_BYTES) -> Any:
    """Read and decode a Chrome trace file; gzip is detected by its magic bytes, not the suffix.

    Args:
        path: A `.json` or `.json.gz` trace as written by `torch.profiler` `export_chrome_trace`.
        max_bytes: Cap on the file size and on its decompressed size (graphdoctor.inputs).

    Returns:
        The decoded JSON document (a dict with `traceEvents`, or a bare event list).

    Raises:
        InputFileError: The file is missing, not a regular file, too large, not gzip/JSON
            (strict: no NaN/Infinity), or truncated.
    """
    ratio = MAX_GZIP_RATIO if max_bytes == MAX_TRACE_BYTES else None  # a raised cap lifts the ratio check
    raw = read_bytes(path, "trace", max_bytes=max_bytes, flag="--max-bytes", max_ratio=ratio)
    # json.loads on bytes is the C decoder end to end; it is the floor we are measured against.
    return loads_json(raw, f"trace {os.fspath(path)}")


def read_trace(path: str | os.PathLike[str], *, max_bytes: int = MAX_TRACE_BYTES) -> TraceEvents:
    """Load a Kineto Chrome trace and keep only the events launch accounting needs.

    Args:
        path: A `.json` or `.json.gz` trace.
        max_bytes: As for load_trace_document.

    Returns:
        TraceEvents with the annotation, host-call, GPU-activity and fill-op buckets filled.

    Raises:
        InputFileError: The file cannot be read, has no `traceEvents` list, or a kept event has
            a field of the wrong type (the message names it: `traceEvents[3].dur: ...`).
    """
    document = load_trace_document(path, max_bytes=max_bytes)
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise InputFileError(
            f"trace {os.fspath(path)}: has no 'traceEvents' list; expected a torch.profiler Chrome trace"
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
    try:
        for event in events:
            bucket = get_bucket(event.get("cat", ""))
            if bucket is not None:
                bucket.append(event)
    except (AttributeError, TypeError):
        # not a dict, or an unhashable category: find the entry and name it
        _check_events_are_dicts(events, path)
        raise
    for bucket_list in (result.host_calls, result.gpu_kernels, result.gpu_memops, user_annotations, cpu_ops):
        check_events(bucket_list, events, path)
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


def _check_events_are_dicts(events: list[Any], path: str) -> None:
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise type_error(f"trace {path}: traceEvents[{i}]", "an event object", event)
        if not isinstance(event.get("cat", ""), str):
            raise type_error(f"trace {path}: traceEvents[{i}].cat", "a string", event.get("cat"))


_NUMBERS = (int, float)
_KEY_TYPES = (int, str, type(None))
_MAX_TIME = float(1 << 62)


def check_events(kept: list[Event], events: list[Event], path: str) -> None:
    """Type-check the fields launch accounting reads from the kept events (name, ts (required),
    dur, args, the correlation ids); the first bad one raises a typed error naming `traceEvents[i].field`.

    Raises:
        InputFileError: a wrong type, a non-finite or out-of-range number.
    """
    for event in kept:
        ts: Any = event.get("ts")
        name, dur, args = event.get("name", ""), event.get("dur", 0), event.get("args")
        if (type(name) is not str or type(ts) not in _NUMBERS or type(dur) not in _NUMBERS
                or not -_MAX_TIME < ts < _MAX_TIME or not 0 <= dur < _MAX_TIME):
            _raise_bad_event(event, events, path)
        if args is not None and (type(args) is not dict or type(args.get("correlation")) not in _KEY_TYPES
                                 or type(args.get("External id")) not in _KEY_TYPES):
            _raise_bad_event(event, events, path)


def _raise_bad_event(event: Event, events: list[Event], path: str) -> None:
    index = next((i for i, e in enumerate(events) if e is event), -1)
    where = f"trace {path}: traceEvents[{index}]"
    checks: list[tuple[str, str, Any]] = [
        ("name", "a string", lambda v: isinstance(v, str)),
        ("ts", "a finite number of microseconds", lambda v: _finite_time(v)),
        ("dur", "a finite non-negative number of microseconds", lambda v: _finite_time(v) and v >= 0),
        ("args", "an object", lambda v: v is None or isinstance(v, dict)),
    ]
    defaults = {"name": "", "ts": None, "dur": 0, "args": None}
    for key, expected, ok in checks:
        value = event.get(key, defaults[key])
        if not ok(value):
            raise type_error(f"{where}.{key}", expected, value)
    for key in ("correlation", "External id"):
        value = event["args"].get(key)
        if type(value) not in _KEY_TYPES:
            raise type_error(f"{where}.args.{key}", "an integer id", value)
    raise InputFileError(f"{where}: malformed event")  # pragma: no cover - one check above fails


def _finite_time(value: Any) -> bool:
    return type(value) in _NUMBERS and -_MAX_TIME < value < _MAX_TIME


__all__ = [
    "ANNOTATION_CATEGORIES",
    "Event",
    "GPU_CATEGORIES",
    "HOST_LAUNCH_CATEGORIES",
    "TraceEvents",
    "bucket_events",
    "check_events",
    "load_trace_document",
    "read_trace",
]
