"""State of one snapshot: bytes by pool, stream and segment type, live bytes by site, free space.

Pure functions over a parsed Snapshot; the results are frozen dataclasses with to_dict().
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from graphdoctor.memory.model import DEFAULT_POOL, Segment, Snapshot, pool_label
from graphdoctor.memory.sites import SiteNamer, is_graphdoctor_site


@dataclass(frozen=True, slots=True)
class GroupBytes:
    """Reserved and live bytes of the segments sharing one key (a pool, a stream or a type)."""

    key: str
    num_segments: int
    reserved_bytes: int
    live_bytes: int
    free_bytes: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SiteBytes:
    """Live bytes held by blocks allocated from one site."""

    site: str
    num_blocks: int
    live_bytes: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class FreeBlock:
    """A cached, unused block: memory reserved by the allocator that no tensor holds."""

    address: int
    size_bytes: int
    pool: str
    stream: int
    segment_type: str

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict (address as hex text, JSON numbers cannot hold it exactly everywhere)."""
        out: dict[str, object] = asdict(self)
        out["address"] = hex(self.address)
        return out


@dataclass(frozen=True, slots=True)
class Totals:
    """Whole-snapshot byte totals."""

    num_segments: int
    num_blocks: int
    num_live_blocks: int
    reserved_bytes: int
    live_bytes: int
    requested_bytes: int
    graph_pool_reserved_bytes: int
    allocated_over_reserved: float
    """Live over reserved bytes: 1.0 is no waste; the rest is cached free space and fragmentation."""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return asdict(self)


def segment_live_bytes(seg: Segment) -> int:
    """Bytes of the segment's live blocks (allocated or pending free)."""
    return sum(b.size_bytes for b in seg.blocks if b.is_live)


def totals(snapshot: Snapshot) -> Totals:
    """Byte totals over all segments."""
    reserved = live = requested = graph = num_live = num_blocks = 0
    for seg in snapshot.segments:
        reserved += seg.total_bytes
        if seg.pool != DEFAULT_POOL:
            graph += seg.total_bytes
        num_blocks += len(seg.blocks)
        for block in seg.blocks:
            if block.is_live:
                live += block.size_bytes
                requested += block.requested_bytes
                num_live += 1
    return Totals(
        num_segments=len(snapshot.segments),
        num_blocks=num_blocks,
        num_live_blocks=num_live,
        reserved_bytes=reserved,
        live_bytes=live,
        requested_bytes=requested,
        graph_pool_reserved_bytes=graph,
        allocated_over_reserved=live / reserved if reserved else 1.0,
    )


def group_segments(segments: Iterable[Segment], key: Callable[[Segment], str]) -> tuple[GroupBytes, ...]:
    """Group segments by key(segment); largest reserved first."""
    acc: dict[str, list[int]] = {}
    for seg in segments:
        row = acc.setdefault(key(seg), [0, 0, 0])
        row[0] += 1
        row[1] += seg.total_bytes
        row[2] += segment_live_bytes(seg)
    groups = [GroupBytes(k, n, reserved, live, reserved - live) for k, (n, reserved, live) in acc.items()]
    return tuple(sorted(groups, key=lambda g: (-g.reserved_bytes, g.key)))


def by_pool(snapshot: Snapshot) -> tuple[GroupBytes, ...]:
    """Segments grouped by segment_pool_id ('default' is (0,0); others are graph private pools)."""
    return group_segments(snapshot.segments, lambda s: pool_label(s.pool))


def by_stream(snapshot: Snapshot) -> tuple[GroupBytes, ...]:
    """Segments grouped by the stream they were allocated on (0 is the legacy default stream)."""
    return group_segments(snapshot.segments, lambda s: hex(s.stream) if s.stream else "0 (default)")


def by_segment_type(snapshot: Snapshot) -> tuple[GroupBytes, ...]:
    """Segments grouped by type: 'large' (>1 MiB allocations) and 'small'."""
    return group_segments(snapshot.segments, lambda s: s.segment_type)


def live_bytes_by_site(snapshot: Snapshot, namer: SiteNamer) -> dict[str, tuple[int, int]]:
    """Map site -> (num_blocks, live bytes) over every live block."""
    acc: dict[str, list[int]] = {}
    for _, block in snapshot.live_blocks():
        row = acc.setdefault(namer.site(block.frames), [0, 0])
        row[0] += 1
        row[1] += block.size_bytes
    return {site: (n, size) for site, (n, size) in acc.items()}


def top_sites(snapshot: Snapshot, namer: SiteNamer, *, limit: int = 15) -> tuple[SiteBytes, ...]:
    """The sites holding the most live bytes, largest first (graphdoctor's own sites last)."""
    rows = [SiteBytes(site, n, size) for site, (n, size) in live_bytes_by_site(snapshot, namer).items()]
    rows.sort(key=lambda r: (is_graphdoctor_site(r.site), -r.live_bytes, r.site))
    return tuple(rows[:limit])


def largest_free_blocks(snapshot: Snapshot, *, limit: int = 10) -> tuple[FreeBlock, ...]:
    """The largest inactive (cached, unused) blocks, largest first."""
    candidates = (
        FreeBlock(b.address, b.size_bytes, pool_label(seg.pool), seg.stream, seg.segment_type)
        for seg in snapshot.segments
        for b in seg.blocks
        if b.state == "inactive"
    )
    return tuple(heapq.nlargest(limit, candidates, key=lambda f: (f.size_bytes, -f.address)))


__all__ = [
    "FreeBlock",
    "GroupBytes",
    "SiteBytes",
    "Totals",
    "by_pool",
    "by_segment_type",
    "by_stream",
    "group_segments",
    "largest_free_blocks",
    "live_bytes_by_site",
    "segment_live_bytes",
    "top_sites",
    "totals",
]
