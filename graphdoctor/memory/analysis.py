"""`triage`: the one-call analysis of a snapshot file (and optionally a baseline to diff against).

Facade over loader, model, summary, blockdiff and phases. Imports no torch; returns frozen data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from graphdoctor.errors import UsageError
from graphdoctor.memory.blockdiff import (
    BlockDiff,
    LeakSuspect,
    diff_blocks,
    leak_suspects,
)
from graphdoctor.memory.loader import (
    DEFAULT_MAX_BYTES,
    load_snapshot,
    load_snapshot_segments,
)
from graphdoctor.memory.model import Snapshot, parse_snapshot
from graphdoctor.memory.phases import PhaseStats, Timeline, phase_stats, timeline
from graphdoctor.memory.sites import SiteNamer
from graphdoctor.memory.summary import (
    FreeBlock,
    GroupBytes,
    SiteBytes,
    Totals,
    by_pool,
    by_segment_type,
    by_stream,
    largest_free_blocks,
    top_sites,
    totals,
)

SCHEMA_VERSION = 1
"""Version of the JSON written by `graphdoctor triage --json` (docs/memory.md)."""


@dataclass(frozen=True, slots=True)
class SnapshotSummary:
    """Everything triage reports about one snapshot."""

    path: str
    file_bytes: int
    totals: Totals
    by_pool: tuple[GroupBytes, ...]
    by_stream: tuple[GroupBytes, ...]
    by_segment_type: tuple[GroupBytes, ...]
    top_sites: tuple[SiteBytes, ...]
    largest_free_blocks: tuple[FreeBlock, ...]
    phases: tuple[PhaseStats, ...] | None
    """Per-phase trace totals; None when the trace was not loaded."""
    num_trace_entries: int | None
    """Entries in the device trace; None when the trace was not loaded (segments-only fast path)."""
    trace_device: int | None
    """Device whose trace was read; None when the trace was not loaded."""

    @property
    def trace_loaded(self) -> bool:
        """True when the allocator history (device_traces) was read."""
        return self.num_trace_entries is not None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return {
            "path": self.path,
            "file_bytes": self.file_bytes,
            "totals": self.totals.to_dict(),
            "by_pool": [g.to_dict() for g in self.by_pool],
            "by_stream": [g.to_dict() for g in self.by_stream],
            "by_segment_type": [g.to_dict() for g in self.by_segment_type],
            "top_sites": [s.to_dict() for s in self.top_sites],
            "largest_free_blocks": [f.to_dict() for f in self.largest_free_blocks],
            "phases": None if self.phases is None else [p.to_dict() for p in self.phases],
            "num_trace_entries": self.num_trace_entries,
            "trace_device": self.trace_device,
        }


@dataclass(frozen=True, slots=True)
class TriageReport:
    """Result of triage(): the snapshot, optionally a baseline, their block diff and leak suspects."""

    snapshot: SnapshotSummary
    against: SnapshotSummary | None
    diff: BlockDiff | None
    leak_suspects: tuple[LeakSuspect, ...]
    all_frames: bool
    timeline: Timeline | None
    """Allocated bytes over time of `snapshot`; only computed when asked (HTML report)."""

    @property
    def has_leak_suspects(self) -> bool:
        """True when a baseline was given and some site's live bytes grew."""
        return bool(self.leak_suspects)

    def to_dict(self) -> dict[str, object]:
        """JSON document (schema_version 1, see docs/memory.md)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "all_frames": self.all_frames,
            "snapshot": self.snapshot.to_dict(),
            "against": self.against.to_dict() if self.against else None,
            "diff": self.diff.to_dict() if self.diff else None,
            "leak_suspects": [s.to_dict() for s in self.leak_suspects],
        }


def summarize(snapshot: Snapshot, namer: SiteNamer, *, path: str = "", file_bytes: int = 0,
              top: int = 15, trace_loaded: bool = True) -> SnapshotSummary:
    """Summarize one parsed snapshot (no I/O); trace_loaded=False leaves the trace fields None."""
    return SnapshotSummary(
        path=path,
        file_bytes=file_bytes,
        totals=totals(snapshot),
        by_pool=by_pool(snapshot),
        by_stream=by_stream(snapshot),
        by_segment_type=by_segment_type(snapshot),
        top_sites=top_sites(snapshot, namer, limit=top),
        largest_free_blocks=largest_free_blocks(snapshot, limit=min(top, 10)),
        phases=phase_stats(snapshot) if trace_loaded else None,
        num_trace_entries=len(snapshot.trace) if trace_loaded else None,
        trace_device=snapshot.trace_device if trace_loaded else None,
    )


def _load(path: str | os.PathLike[str], max_bytes: int, with_trace: bool) -> tuple[Snapshot, int, bool]:
    """(parsed snapshot, file size, whether device_traces were read)."""
    file_path = Path(path)
    if with_trace:
        raw, trace_loaded = load_snapshot(file_path, max_bytes=max_bytes), True
    else:
        # Plain triage reads only segments: skip unpickling the allocator history when possible.
        raw, trace_loaded = load_snapshot_segments(file_path, max_bytes=max_bytes)
    return parse_snapshot(raw), file_path.stat().st_size, trace_loaded


def triage(
    path: str | os.PathLike[str],
    against: str | os.PathLike[str] | None = None,
    all_frames: bool = False,
    *,
    top: int = 15,
    min_growth_bytes: int = 1,
    max_bytes: int = DEFAULT_MAX_BYTES,
    with_timeline: bool = False,
    with_trace: bool = False,
) -> TriageReport:
    """Analyze a snapshot file, and diff it against a baseline snapshot when one is given.

    Args:
        path: The snapshot to triage (plain or gzip pickle; loaded without executing anything).
        against: A baseline snapshot taken earlier; the diff goes from `against` to `path`.
        all_frames: Group by the whole Python stack instead of the first user frame.
        top: Number of sites (and diff site groups) to keep.
        min_growth_bytes: A site is a leak suspect when its live bytes grew by at least this.
        max_bytes: Size cap for each file (see load_snapshot).
        with_timeline: Also compute allocated bytes over time (for the HTML report); reads the
            trace of `path` (not of `against`) as with_trace does.
        with_trace: Read the allocator history (device_traces) of both files, for the per-phase
            table and trace entry counts. Without it only segments are unpickled where the file
            allows (see load_snapshot_segments), and the summaries' trace fields are None.

    Returns:
        The TriageReport.

    Raises:
        InputFileError: a file is missing, too large, truncated, corrupt or not a snapshot.
        UsageError: top or min_growth_bytes out of range.
    """
    if top < 1:
        raise UsageError(f"top: got {top}, expected >= 1")
    if min_growth_bytes < 1:
        raise UsageError(f"min_growth_bytes: got {min_growth_bytes}, expected >= 1")
    namer = SiteNamer(all_frames=all_frames)
    snap, size, trace_loaded = _load(path, max_bytes, with_trace or with_timeline)
    summary = summarize(snap, namer, path=str(path), file_bytes=size, top=top, trace_loaded=trace_loaded)
    base_summary = diff = None
    suspects: tuple[LeakSuspect, ...] = ()
    if against is not None:
        base, base_size, base_trace_loaded = _load(against, max_bytes, with_trace)
        base_summary = summarize(base, namer, path=str(against), file_bytes=base_size, top=top,
                                 trace_loaded=base_trace_loaded)
        diff = diff_blocks(base, snap, namer, limit=top)
        suspects = leak_suspects(base, snap, namer, min_growth_bytes=min_growth_bytes)[:top]
    return TriageReport(
        snapshot=summary,
        against=base_summary,
        diff=diff,
        leak_suspects=suspects,
        all_frames=all_frames,
        timeline=timeline(snap) if with_timeline else None,
    )


__all__ = ["SCHEMA_VERSION", "SnapshotSummary", "TriageReport", "summarize", "triage"]
