"""The memory section one child run reports: allocator statistics and, for graphed runs, the
MemoryReport of its snapshots. Typed on both sides of the child protocol; pure Python."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from graphdoctor.memory.leaks import MemoryReport


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """torch.cuda.memory_stats figures at the end of a run (graphdoctor.memory.recorder)."""

    allocated_bytes: int = 0
    reserved_bytes: int = 0
    active_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    num_alloc_retries: int = 0
    num_ooms: int = 0

    def to_dict(self) -> dict[str, int]:
        """JSON view."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryStats:
        """Inverse of to_dict (keys this version does not know are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class MemorySection:
    """What the memory observer of one run found."""

    stats: MemoryStats
    """Allocator statistics (every run)."""

    report: MemoryReport | None = None
    """Snapshot analysis around capture and replay (graphed runs)."""

    snapshot_reserved_bytes: int | None = None
    """Reserved bytes summed over the last snapshot's segments."""

    stats_reserved_bytes: int | None = None
    """Reserved bytes by memory_stats at the same point."""

    snapshot_vs_stats_pct: float | None = None
    """How far the two disagree, in percent of the stats figure."""

    error: str | None = None
    """Why the memory analysis failed (the run itself went on)."""

    @property
    def summary(self) -> str | None:
        """The report's one-line summary, when there is a report."""
        return self.report.summary() if self.report is not None else None

    def against_eager(self, eager: MemoryStats) -> MemorySection:
        """This section with the eager reference's peaks filled in (the parent knows them only once
        both runs ended; the children may run at the same time)."""
        if self.report is None:
            return self
        report = replace(self.report, eager_peak_allocated_bytes=eager.peak_allocated_bytes,
                         eager_peak_reserved_bytes=eager.peak_reserved_bytes)
        return replace(self, report=report)

    def to_dict(self) -> dict[str, Any]:
        """JSON view: `stats`, then the report's fields flat (as schema 1 wrote them)."""
        out: dict[str, Any] = {"stats": self.stats.to_dict()}
        if self.report is not None:
            out.update(self.report.to_dict())
            out.update(snapshot_reserved_bytes=self.snapshot_reserved_bytes,
                       stats_reserved_bytes=self.stats_reserved_bytes,
                       snapshot_vs_stats_pct=self.snapshot_vs_stats_pct)
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemorySection:
        """Inverse of to_dict."""
        report = MemoryReport.from_dict(data) if "verdict" in data else None
        return cls(stats=MemoryStats.from_dict(data.get("stats") or {}), report=report,
                   snapshot_reserved_bytes=data.get("snapshot_reserved_bytes"),
                   stats_reserved_bytes=data.get("stats_reserved_bytes"),
                   snapshot_vs_stats_pct=data.get("snapshot_vs_stats_pct"),
                   error=data.get("error"))


__all__ = ["MemorySection", "MemoryStats"]
