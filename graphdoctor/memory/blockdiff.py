"""Block-level diff of two snapshots (new, freed, resized blocks by pool and by site) and leak suspects.

Blocks are matched by address. Same address and size but a different allocation site counts as one
block freed and one new: the memory was released and handed to someone else.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from graphdoctor.memory.model import Block, Snapshot, pool_label
from graphdoctor.memory.sites import SiteNamer, is_graphdoctor_site
from graphdoctor.memory.summary import live_bytes_by_site


@dataclass(frozen=True, slots=True)
class DiffGroup:
    """Block changes that belong to one pool or one site."""

    key: str
    num_new: int
    new_bytes: int
    num_freed: int
    freed_bytes: int
    num_resized: int
    resized_delta_bytes: int

    @property
    def net_bytes(self) -> int:
        """Live bytes gained (negative: released) by this group between the two snapshots."""
        return self.new_bytes - self.freed_bytes + self.resized_delta_bytes

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict, net_bytes included."""
        out: dict[str, object] = asdict(self)
        out["net_bytes"] = self.net_bytes
        return out


@dataclass(frozen=True, slots=True)
class LeakSuspect:
    """A site whose live bytes grew from the first snapshot to the second."""

    site: str
    before_bytes: int
    after_bytes: int
    before_blocks: int
    after_blocks: int

    @property
    def growth_bytes(self) -> int:
        """after_bytes - before_bytes."""
        return self.after_bytes - self.before_bytes

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict, growth_bytes included."""
        out: dict[str, object] = asdict(self)
        out["growth_bytes"] = self.growth_bytes
        return out


@dataclass(frozen=True, slots=True)
class BlockDiff:
    """What changed between two snapshots, block by block and segment by segment."""

    total: DiffGroup
    by_pool: tuple[DiffGroup, ...]
    by_site: tuple[DiffGroup, ...]
    num_segments_new: int
    segment_bytes_new: int
    num_segments_freed: int
    segment_bytes_freed: int
    reserved_delta_bytes: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return {
            "total": self.total.to_dict(),
            "by_pool": [g.to_dict() for g in self.by_pool],
            "by_site": [g.to_dict() for g in self.by_site],
            "num_segments_new": self.num_segments_new,
            "segment_bytes_new": self.segment_bytes_new,
            "num_segments_freed": self.num_segments_freed,
            "segment_bytes_freed": self.segment_bytes_freed,
            "reserved_delta_bytes": self.reserved_delta_bytes,
        }


class _Acc:
    """Mutable counters behind one DiffGroup."""

    __slots__ = ("num_new", "new_bytes", "num_freed", "freed_bytes", "num_resized", "resized_delta")

    def __init__(self) -> None:
        self.num_new = self.new_bytes = self.num_freed = self.freed_bytes = 0
        self.num_resized = self.resized_delta = 0

    def freeze(self, key: str) -> DiffGroup:
        return DiffGroup(key, self.num_new, self.new_bytes, self.num_freed, self.freed_bytes,
                         self.num_resized, self.resized_delta)


def _live_index(snapshot: Snapshot) -> dict[int, tuple[Block, str]]:
    return {b.address: (b, pool_label(seg.pool)) for seg, b in snapshot.live_blocks()}


def _freeze_all(acc: dict[str, _Acc], limit: int) -> tuple[DiffGroup, ...]:
    groups = [a.freeze(k) for k, a in acc.items()]
    groups.sort(key=lambda g: (-abs(g.net_bytes), -(g.new_bytes + g.freed_bytes), g.key))
    return tuple(groups[:limit])


def diff_blocks(before: Snapshot, after: Snapshot, namer: SiteNamer, *, limit: int = 20) -> BlockDiff:
    """Diff the live blocks of two snapshots.

    Args:
        before: The earlier snapshot.
        after: The later snapshot.
        namer: Folds stacks to sites (first user frame, or all frames).
        limit: Keep this many site groups (largest net change first); pools are all kept.

    Returns:
        The BlockDiff.
    """
    old, new = _live_index(before), _live_index(after)
    total = _Acc()
    pools: dict[str, _Acc] = {}
    sites: dict[str, _Acc] = {}

    def bump(kind: str, block: Block, pool: str, delta: int) -> None:
        for acc in (total, pools.setdefault(pool, _Acc()), sites.setdefault(namer.site(block.frames), _Acc())):
            if kind == "new":
                acc.num_new += 1
                acc.new_bytes += delta
            elif kind == "freed":
                acc.num_freed += 1
                acc.freed_bytes += delta
            else:
                acc.num_resized += 1
                acc.resized_delta += delta

    for addr, (block, pool) in new.items():
        prev = old.get(addr)
        if prev is None or (prev[0].size_bytes == block.size_bytes and namer.site(prev[0].frames) != namer.site(block.frames)):
            bump("new", block, pool, block.size_bytes)
            if prev is not None:
                bump("freed", prev[0], prev[1], prev[0].size_bytes)
        elif prev[0].size_bytes != block.size_bytes:
            bump("resized", block, pool, block.size_bytes - prev[0].size_bytes)
    for addr, (block, pool) in old.items():
        if addr not in new:
            bump("freed", block, pool, block.size_bytes)
    old_segs = {(s.address, s.total_bytes) for s in before.segments}
    new_segs = {(s.address, s.total_bytes) for s in after.segments}
    return BlockDiff(
        total=total.freeze("total"),
        by_pool=_freeze_all(pools, len(pools)),
        by_site=_freeze_all(sites, limit),
        num_segments_new=len(new_segs - old_segs),
        segment_bytes_new=sum(size for _, size in new_segs - old_segs),
        num_segments_freed=len(old_segs - new_segs),
        segment_bytes_freed=sum(size for _, size in old_segs - new_segs),
        reserved_delta_bytes=sum(s for _, s in new_segs) - sum(s for _, s in old_segs),
    )


def leak_suspects(
    before: Snapshot, after: Snapshot, namer: SiteNamer, *, min_growth_bytes: int = 1
) -> tuple[LeakSuspect, ...]:
    """Sites whose live bytes grew by at least min_growth_bytes, largest growth first (sites made only of
    graphdoctor's own frames after all others)."""
    old = live_bytes_by_site(before, namer)
    new = live_bytes_by_site(after, namer)
    out = []
    for site, (num_after, bytes_after) in new.items():
        num_before, bytes_before = old.get(site, (0, 0))
        if bytes_after - bytes_before >= min_growth_bytes:
            out.append(LeakSuspect(site, bytes_before, bytes_after, num_before, num_after))
    out.sort(key=lambda s: (is_graphdoctor_site(s.site), -s.growth_bytes, s.site))
    return tuple(out)


__all__ = ["BlockDiff", "DiffGroup", "LeakSuspect", "diff_blocks", "leak_suspects"]
