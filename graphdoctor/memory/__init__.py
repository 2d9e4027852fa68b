"""graphdoctor.memory: CUDA memory snapshots, read safely and analyzed without torch or a GPU.

`triage(path)` summarizes a snapshot file (and diffs it against a baseline); `analyze_run(...)` gives
the in-run verdict for `graphdoctor diff`. The GPU-side recording helpers live in
graphdoctor.memory.recorder (imported on demand: it needs torch).
"""

from __future__ import annotations

from graphdoctor.memory.analysis import SCHEMA_VERSION, SnapshotSummary, TriageReport, triage
from graphdoctor.memory.blockdiff import BlockDiff, DiffGroup, LeakSuspect
from graphdoctor.memory.leaks import MemoryReport, PoolBytes, UnfreedSite, analyze_run
from graphdoctor.memory.loader import DEFAULT_MAX_BYTES, load_snapshot, loads_snapshot, save_snapshot
from graphdoctor.memory.model import Snapshot, parse_snapshot

__all__ = [
    "DEFAULT_MAX_BYTES",
    "SCHEMA_VERSION",
    "BlockDiff",
    "DiffGroup",
    "LeakSuspect",
    "MemoryReport",
    "PoolBytes",
    "Snapshot",
    "SnapshotSummary",
    "TriageReport",
    "UnfreedSite",
    "analyze_run",
    "load_snapshot",
    "loads_snapshot",
    "parse_snapshot",
    "save_snapshot",
    "triage",
]
