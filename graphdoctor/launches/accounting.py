"""Launch accounting: host launch calls, eager vs in-graph GPU kernels, RNG prologue fills.

Input is a Kineto Chrome trace (trace.py); output is frozen LaunchCount records for the whole
trace, each `ProfilerStep#N` and each graphdoctor phase range. Pure Python: no torch import.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from graphdoctor.collector import collector_paused
from graphdoctor.inputs import MAX_TRACE_BYTES
from graphdoctor.launches.counts import (
    PHASES,
    LaunchCount,
    LaunchTable,
    TraceAccounting,
    classify_host_call,
    merge_counts,
)
from graphdoctor.launches.trace import PHASE_PREFIX, PROFILER_STEP_PREFIX, Event, TraceEvents, read_trace

_FILL_KERNEL_MARKER = "FillFunctor"
_NO_ARGS: dict[str, object] = {}


@dataclass(slots=True)
class _Launches:
    """Host launch calls as parallel columns (one entry per call), joined to their GPU work.

    Columns instead of one object per call: every step below is a comprehension or a
    C-level Counter, which keeps accounting cheap next to json.loads on 100 MB traces.
    """

    ts: list[float]
    tid: list[str]
    name: list[str]
    kind: list[str]
    num_kernels: list[int]
    kernel_time_us: list[float]
    num_memops: list[int]


def _gpu_by_correlation(trace: TraceEvents) -> tuple[Counter[object], dict[object, float], Counter[object], set[object]]:
    """Kernel count, kernel time and memop count per correlation id; correlations of fill kernels."""
    corrs = [(e.get("args") or _NO_ARGS).get("correlation") for e in trace.gpu_kernels]
    num_kernels = Counter(corrs)
    kernel_time: dict[object, float] = defaultdict(float)
    for corr, event in zip(corrs, trace.gpu_kernels, strict=False):
        kernel_time[corr] += float(event.get("dur", 0.0))
    fills = {c for c, e in zip(corrs, trace.gpu_kernels, strict=False) if _FILL_KERNEL_MARKER in e.get("name", "")}
    memops = Counter((e.get("args") or _NO_ARGS).get("correlation") for e in trace.gpu_memops)
    return num_kernels, kernel_time, memops, fills


def _collect_launches(trace: TraceEvents) -> tuple[_Launches, int]:
    """Launch columns, prologue fills marked, plus the number of unattributed GPU kernels."""
    num_kernels, kernel_time, memops, fill_corrs = _gpu_by_correlation(trace)
    kinds = {name: classify_host_call(name) for name in {e.get("name", "") for e in trace.host_calls}}
    events = [e for e in trace.host_calls if kinds[e.get("name", "")] is not None]
    args = [e.get("args") or _NO_ARGS for e in events]
    corrs = [a.get("correlation") for a in args]
    names = [e["name"] for e in events]
    kind = [kinds[n] or "" for n in names]
    fill_ids = {(e.get("args") or _NO_ARGS).get("External id") for e in trace.fill_ops} - {None}
    is_fill = [
        k == "kernel" and (a.get("External id") in fill_ids or c in fill_corrs)
        for k, a, c in zip(kind, args, corrs, strict=False)
    ]
    launches = _Launches(
        ts=[float(e["ts"]) for e in events],
        tid=[str(e.get("tid")) for e in events],
        name=names,
        kind=kind,
        num_kernels=[num_kernels.get(c, 0) for c in corrs],
        kernel_time_us=[kernel_time.get(c, 0.0) for c in corrs],
        num_memops=[memops.get(c, 0) for c in corrs],
    )
    _mark_prologue(launches, is_fill)
    seen = set(corrs)
    unattributed = sum(n for c, n in num_kernels.items() if c not in seen)
    return launches, unattributed


def _mark_prologue(launches: _Launches, is_fill: list[bool]) -> None:
    """Relabel fill kernels issued back to back right before a graph launch on the same thread.

    `CUDAGraph.replay()` fills the RNG seed/offset tensors (aten::fill_) and then calls
    cudaGraphLaunch; no other launch comes in between. The count per replay depends on the torch
    version and on how many generators the graph registered, so it is observed, never assumed.
    """
    keys = list(zip(launches.tid, launches.ts, strict=False))
    order = sorted(range(len(keys)), key=keys.__getitem__)
    kind = launches.kind
    pending: list[int] = []
    tid = None
    for i in order:
        if launches.tid[i] != tid:
            pending, tid = [], launches.tid[i]
        if kind[i] == "graph":
            for j in pending:
                kind[j] = "prologue"
            pending = []
        elif is_fill[i]:
            pending.append(i)
        elif pending:
            pending = []


class _Ranges:
    """Time ranges of one kind (steps or phases) with a containment lookup."""

    def __init__(self, events: list[Event]) -> None:
        ordered = sorted(events, key=lambda e: float(e["ts"]))
        self.events = ordered
        self.starts = [float(e["ts"]) for e in ordered]
        self.ends = [s + float(e.get("dur", 0.0)) for s, e in zip(self.starts, ordered, strict=False)]
        # Running max of ends lets the backwards walk stop early even when ranges nest.
        self.max_end: list[float] = []
        running = float("-inf")
        for end in self.ends:
            running = max(running, end)
            self.max_end.append(running)

    def find(self, ts: float) -> int | None:
        """Index of the innermost (latest-starting) range containing ts, or None."""
        i = bisect_right(self.starts, ts) - 1
        while i >= 0 and self.max_end[i] >= ts:
            if self.ends[i] >= ts:
                return i
            i -= 1
        return None


def _split_annotations(trace: TraceEvents) -> tuple[list[Event], list[Event]]:
    """ProfilerStep ranges and well-formed graphdoctor phase ranges."""
    steps, phases = [], []
    for event in trace.annotations:
        name = event.get("name", "")
        if name.startswith(PROFILER_STEP_PREFIX):
            steps.append(event)
        elif name.startswith(PHASE_PREFIX) and name.count("/") >= 3:
            phases.append(event)
    return steps, phases


def _phase_meta(name: str) -> dict[str, Any]:
    """impl/phase/step of "graphdoctor/<impl>/<phase>/<step>" (impl may itself contain '/')."""
    parts = name.split("/")
    return {"impl": "/".join(parts[1:-2]), "phase": parts[-2], "step": parts[-1]}


def _host_span_us(trace: TraceEvents) -> float:
    """First to last host call, used as host time when the trace has no ProfilerStep ranges."""
    if not trace.host_calls:
        return 0.0
    starts = [float(e["ts"]) for e in trace.host_calls]
    ends = [float(e["ts"]) + float(e.get("dur", 0.0)) for e in trace.host_calls]
    return max(ends) - min(starts)


# launch kind -> (count field, GPU kernels field, kernel time field, GPU memops field)
_KIND_FIELDS = {
    "graph": ("num_graph_launches", "num_gpu_kernels_in_graph", "gpu_kernel_time_in_graph_us",
              "num_gpu_memops_in_graph"),
    "prologue": ("num_prologue_fill_launches", "num_gpu_kernels_prologue",
                 "gpu_kernel_time_prologue_us", "num_gpu_memops_eager"),
    "kernel": ("", "num_gpu_kernels_eager", "gpu_kernel_time_eager_us", "num_gpu_memops_eager"),
    "memcpy": ("num_memcpy_calls", "num_gpu_kernels_eager", "gpu_kernel_time_eager_us", "num_gpu_memops_eager"),
    "memset": ("num_memset_calls", "num_gpu_kernels_eager", "gpu_kernel_time_eager_us", "num_gpu_memops_eager"),
}


def _aggregate(slots: list[int | None], launches: _Launches, num_slots: int) -> list[dict[str, Any]]:
    """LaunchCount keyword arguments for each slot (step, phase, or the single total slot)."""
    out: list[dict[str, Any]] = [
        {"launch_calls": {}, "kernels_per_graph_launch": [], "num_kernel_launches": 0} for _ in range(num_slots)
    ]
    for (slot, name), num in Counter(zip(slots, launches.name, strict=False)).items():
        if slot is not None:
            out[slot]["launch_calls"][name] = num
    sums: dict[tuple[int, str], list[Any]] = {}
    for slot, kind, num_kernels, time_us, num_memops in zip(
        slots, launches.kind, launches.num_kernels, launches.kernel_time_us, launches.num_memops, strict=False
    ):
        if slot is None:
            continue
        acc = sums.get((slot, kind))
        if acc is None:
            acc = sums[(slot, kind)] = [0, 0, 0.0, 0]
        acc[0] += 1
        acc[1] += num_kernels
        acc[2] += time_us
        acc[3] += num_memops
    for (slot, kind), (num_calls, num_kernels, time_us, num_memops) in sums.items():
        fields = out[slot]
        count_field, kernels_field, time_field, memops_field = _KIND_FIELDS[kind]
        if count_field:
            fields[count_field] = fields.get(count_field, 0) + int(num_calls)
        if kind in ("kernel", "prologue"):
            fields["num_kernel_launches"] += int(num_calls)
        fields[kernels_field] = fields.get(kernels_field, 0) + int(num_kernels)
        fields[time_field] = fields.get(time_field, 0.0) + time_us
        fields[memops_field] = fields.get(memops_field, 0) + int(num_memops)
    graph_launches = sorted((launches.ts[i], i) for i, k in enumerate(launches.kind) if k == "graph")
    for _, i in graph_launches:
        slot = slots[i]
        if slot is not None:
            out[slot]["kernels_per_graph_launch"].append(launches.num_kernels[i])
    for fields in out:
        fields["kernels_per_graph_launch"] = tuple(fields["kernels_per_graph_launch"])
    return out


def account_events(trace: TraceEvents) -> TraceAccounting:
    """Run the launch accounting on an already-read trace.

    Args:
        trace: Output of read_trace (or bucket_events).

    Returns:
        TraceAccounting with total, per-step and per-phase records and eager-vs-graphed tables.
    """
    launches, unattributed = _collect_launches(trace)
    step_events, phase_events = _split_annotations(trace)
    steps, phases = _Ranges(step_events), _Ranges(phase_events)
    step_fields = _aggregate([steps.find(t) for t in launches.ts], launches, len(steps.events))
    phase_fields = _aggregate([phases.find(t) for t in launches.ts], launches, len(phases.events))
    (total_fields,) = _aggregate([0] * len(launches.ts), launches, 1)
    step_records = tuple(
        LaunchCount(
            label=e["name"],
            step=e["name"][len(PROFILER_STEP_PREFIX) :],
            host_time_us=float(e.get("dur", 0.0)),
            **fields,
        )
        for fields, e in zip(step_fields, steps.events, strict=False)
    )
    phase_records = tuple(
        LaunchCount(label=e["name"], host_time_us=float(e.get("dur", 0.0)), **_phase_meta(e["name"]), **fields)
        for fields, e in zip(phase_fields, phases.events, strict=False)
    )
    host_time = sum(s.host_time_us for s in step_records) if step_records else _host_span_us(trace)
    total_record = LaunchCount(
        label="total",
        num_steps=max(1, len(step_records)),
        host_time_us=host_time,
        num_gpu_kernels_unattributed=unattributed,
        **total_fields,
    )
    return TraceAccounting(
        source=trace.path,
        num_events=trace.num_events,
        total=total_record,
        steps=step_records,
        phases=phase_records,
        tables=build_tables(phase_records),
    )


def build_tables(phases: tuple[LaunchCount, ...]) -> tuple[LaunchTable, ...]:
    """Eager-vs-graphed tables: per impl, `eager` phases merged vs `replay` phases merged.

    Args:
        phases: Phase records as in TraceAccounting.phases.

    Returns:
        One LaunchTable per implementation that has an eager or replay phase, in order of
        first appearance.
    """
    impls = list(dict.fromkeys(p.impl for p in phases if p.impl is not None))
    tables = []
    for impl in impls:
        columns = {}
        for phase in ("eager", "replay"):
            found = [p for p in phases if p.impl == impl and p.phase == phase]
            columns[phase] = merge_counts(found, label=f"{impl}/{phase}") if found else None
        if columns["eager"] or columns["replay"]:
            tables.append(LaunchTable(impl=impl, eager=columns["eager"], graphed=columns["replay"]))
    return tuple(tables)


def account_trace(path: str | os.PathLike[str], *, max_bytes: int = MAX_TRACE_BYTES) -> TraceAccounting:
    """Read a Kineto Chrome trace and run the launch accounting on it.

    Args:
        path: `.json` or `.json.gz` trace from `torch.profiler` `export_chrome_trace`.
        max_bytes: Cap on the trace's (decompressed) size (graphdoctor.inputs.MAX_TRACE_BYTES).

    Returns:
        TraceAccounting with total, per-step and per-phase LaunchCount records.

    Raises:
        InputFileError: The trace cannot be read or is not a Chrome trace.
    """
    # The decoded trace holds millions of dicts; with the collector on, every few thousand new
    # containers trigger a collection that re-walks all of them (measured: 0.7 s to build 5k
    # small dicts after loading a 100 MB trace). Nothing here creates reference cycles.
    with collector_paused():
        return account_events(read_trace(path, max_bytes=max_bytes))


__all__ = [
    "PHASES",
    "LaunchCount",
    "LaunchTable",
    "TraceAccounting",
    "account_events",
    "account_trace",
    "build_tables",
]
