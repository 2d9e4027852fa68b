"""The allocator history (device_traces): allocated bytes over time and per-phase totals.

Phases are the trace entries' `user_metadata` (set with torch.cuda.memory._set_memory_metadata, or
graphdoctor.memory.recorder.set_phase). Without phase tags the timeline is labelled by pool instead.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from typing import Any

from graphdoctor.memory.model import Snapshot, pool_label

UNTAGGED = "(untagged)"
"""Phase label of trace entries recorded without user_metadata."""

UNKNOWN_POOL = "(segment since freed)"
"""Pool label of events whose segment no longer exists in the snapshot."""


@dataclass(frozen=True, slots=True)
class PhaseStats:
    """Allocator activity recorded while one phase tag was set."""

    phase: str
    num_events: int
    num_allocs: int
    alloc_bytes: int
    num_frees: int
    freed_bytes: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Timeline:
    """Allocated bytes after each (downsampled) trace event, each point labelled by phase or pool."""

    color_by: str
    """'phase' when the trace carries user_metadata tags, else 'pool'."""
    labels: tuple[str, ...]
    """Distinct labels in first-seen order."""
    event_index: tuple[int, ...]
    allocated_bytes: tuple[int, ...]
    label_index: tuple[int, ...]
    """Per point, an index into labels."""
    num_events: int
    time_us_first: int
    time_us_last: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return asdict(self)


def phase_family(tag: str) -> str:
    """'replay:7' -> 'replay': step-indexed tags are grouped by the text before the first ':'."""
    return tag.split(":", 1)[0] if tag else UNTAGGED


def _free_action(snapshot: Snapshot) -> str:
    # free_completed is when memory returns to the allocator; traces recorded with
    # skip_actions=["free_completed"] only have free_requested.
    for entry in snapshot.trace:
        if entry.get("action") == "free_completed":
            return "free_completed"
    return "free_requested"


def phase_stats(snapshot: Snapshot) -> tuple[PhaseStats, ...]:
    """Per-phase allocation and free totals (phases grouped by phase_family), in first-seen order."""
    free_action = _free_action(snapshot)
    # Hot loop over millions of entries: count per (raw tag, action) and fold families afterwards.
    counts: dict[tuple[Any, Any], list[int]] = {}
    for entry in snapshot.trace:
        key = (entry.get("user_metadata"), entry.get("action"))
        row = counts.get(key)
        if row is None:
            row = counts[key] = [0, 0]
        row[0] += 1
        row[1] += entry.get("size", 0)
    acc: dict[str, list[int]] = {}
    for (tag, action), (num, size) in counts.items():
        row = acc.setdefault(phase_family(tag or ""), [0, 0, 0, 0, 0])
        row[0] += num
        if action == "alloc":
            row[1] += num
            row[2] += size
        elif action == free_action:
            row[3] += num
            row[4] += size
    return tuple(PhaseStats(k, *v) for k, v in acc.items())


class _PoolLookup:
    """Address -> pool label, from the segments alive at snapshot time."""

    def __init__(self, snapshot: Snapshot) -> None:
        segs = sorted(snapshot.segments, key=lambda s: s.address)
        self._starts = [s.address for s in segs]
        self._segs = segs

    def label(self, addr: int) -> str:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0:
            seg = self._segs[i]
            if addr < seg.address + seg.total_bytes:
                return pool_label(seg.pool)
        return UNKNOWN_POOL


def _levels(snapshot: Snapshot, free_action: str) -> list[int]:
    deltas = []
    for entry in snapshot.trace:
        action = entry.get("action")
        if action == "alloc":
            deltas.append(entry.get("size", 0))
        elif action == free_action:
            deltas.append(-entry.get("size", 0))
        else:
            deltas.append(0)
    # The ring buffer may have dropped early entries: anchor on the snapshot's live bytes at the
    # end and walk backwards, so the curve is absolute rather than relative to the first entry.
    final_live = sum(b.size_bytes for _, b in snapshot.live_blocks())
    level = final_live - sum(deltas)
    out = []
    for delta in deltas:
        level += delta
        out.append(level)
    return out


def timeline(snapshot: Snapshot, *, max_points: int = 1500) -> Timeline:
    """Allocated bytes over the trace, downsampled to at most max_points (keeping bucket maxima).

    Args:
        snapshot: A parsed snapshot with a device trace (an empty trace gives an empty timeline).
        max_points: Upper bound on the number of points kept.

    Returns:
        The Timeline, labelled by phase when any entry has user_metadata, else by pool.
    """
    trace = snapshot.trace
    tagged = any(entry.get("user_metadata") for entry in trace)
    lookup = None if tagged else _PoolLookup(snapshot)
    levels = _levels(snapshot, _free_action(snapshot))
    labels: dict[str, int] = {}
    idx_out: list[int] = []
    bytes_out: list[int] = []
    label_out: list[int] = []
    num = len(trace)
    step = max(1, -(-num // max_points))
    for start in range(0, num, step):
        best = max(range(start, min(num, start + step)), key=levels.__getitem__)
        entry = trace[best]
        if lookup is None:
            label = phase_family(entry.get("user_metadata") or "")
        else:
            label = lookup.label(entry.get("addr", 0) or 0)
        idx_out.append(best)
        bytes_out.append(max(0, levels[best]))
        label_out.append(labels.setdefault(label, len(labels)))
    return Timeline(
        color_by="phase" if tagged else "pool",
        labels=tuple(labels),
        event_index=tuple(idx_out),
        allocated_bytes=tuple(bytes_out),
        label_index=tuple(label_out),
        num_events=num,
        time_us_first=trace[0].get("time_us", 0) if trace else 0,
        time_us_last=trace[-1].get("time_us", 0) if trace else 0,
    )


__all__ = ["UNKNOWN_POOL", "UNTAGGED", "PhaseStats", "Timeline", "phase_family", "phase_stats", "timeline"]
