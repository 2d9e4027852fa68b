"""In-run memory analysis for `graphdoctor diff`: graph pool cost, peaks vs eager, growth per replay.

Runs inside the child process on the snapshot dicts taken before capture, after capture and after
the replay steps; only MemoryReport.to_dict() travels back. Pure Python, no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphdoctor.errors import UsageError
from graphdoctor.memory.model import FrameCache, Snapshot, frames_from_raw, parse_snapshot
from graphdoctor.memory.phases import phase_family
from graphdoctor.memory.sites import SiteNamer, is_graphdoctor_site, user_frames_first
from graphdoctor.memory.summary import totals

REPLAY_PHASE = "replay"
"""Phase family whose allocations are checked; tag steps 'replay:<step>' to count steps per site."""

DEFAULT_GROWTH_THRESHOLD_BYTES = 64 << 10
"""Live bytes gained per replay step above which the verdict is 'growth'."""

DEFAULT_MIN_UNFREED_STEPS = 2
"""A site is a leak suspect when allocations from this many replay steps are still alive: the
last step's outputs (a loss kept for logging) are legitimately alive once."""

_MAX_FRAMES = 8


@dataclass(frozen=True, slots=True)
class PoolBytes:
    """Reserved and live bytes of one private (graph) pool."""

    pool: tuple[int, int]
    reserved_bytes: int
    live_bytes: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict (pool as a 2-list)."""
        return {"pool": list(self.pool), "reserved_bytes": self.reserved_bytes, "live_bytes": self.live_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoolBytes:
        """Inverse of to_dict."""
        first, second = data["pool"]
        return cls(pool=(int(first), int(second)), reserved_bytes=int(data["reserved_bytes"]),
                   live_bytes=int(data["live_bytes"]))


@dataclass(frozen=True, slots=True)
class UnfreedSite:
    """Allocations made during replay steps that are still alive after the last step, by site."""

    site: str
    num_allocations: int
    live_bytes: int
    num_steps: int
    """Distinct replay tags ('replay:3', 'replay:4', ...) the allocations were made under."""
    is_suspect: bool
    frames: tuple[str, ...]
    """Stack of the first allocation, user frames first, at most 8."""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return {
            "site": self.site,
            "num_allocations": self.num_allocations,
            "live_bytes": self.live_bytes,
            "num_steps": self.num_steps,
            "is_suspect": self.is_suspect,
            "frames": list(self.frames),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UnfreedSite:
        """Inverse of to_dict."""
        return cls(site=str(data["site"]), num_allocations=int(data["num_allocations"]),
                   live_bytes=int(data["live_bytes"]), num_steps=int(data["num_steps"]),
                   is_suspect=bool(data["is_suspect"]), frames=tuple(data.get("frames", ())))


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """Memory verdict of one graphed run ('ok' or 'growth') and the numbers behind it."""

    verdict: str
    num_replay_steps: int
    graph_pool_reserved_bytes: int
    graph_pools: tuple[PoolBytes, ...]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    eager_peak_allocated_bytes: int | None
    eager_peak_reserved_bytes: int | None
    live_bytes_before_capture: int
    live_bytes_after_capture: int
    live_bytes_after_replays: int
    reserved_bytes_after_replays: int
    bytes_gained_per_replay_step: float
    growth_threshold_bytes: int
    unfreed_replay_sites: tuple[UnfreedSite, ...]
    allocated_over_reserved: float
    phase_tags_found: bool
    notes: tuple[str, ...]

    @property
    def capture_cost_bytes(self) -> int:
        """Live bytes that capture added (graph-owned outputs and intermediates)."""
        return self.live_bytes_after_capture - self.live_bytes_before_capture

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict for the `memory` field of the diff report."""
        def ratio(peak: int, eager: int | None) -> float | None:
            return round(peak / eager, 4) if eager else None

        return {
            "verdict": self.verdict,
            "summary": self.summary(),
            "num_replay_steps": self.num_replay_steps,
            "graph_pool_reserved_bytes": self.graph_pool_reserved_bytes,
            "graph_pools": [p.to_dict() for p in self.graph_pools],
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "eager_peak_allocated_bytes": self.eager_peak_allocated_bytes,
            "eager_peak_reserved_bytes": self.eager_peak_reserved_bytes,
            "peak_allocated_over_eager": ratio(self.peak_allocated_bytes, self.eager_peak_allocated_bytes),
            "peak_reserved_over_eager": ratio(self.peak_reserved_bytes, self.eager_peak_reserved_bytes),
            "live_bytes_before_capture": self.live_bytes_before_capture,
            "live_bytes_after_capture": self.live_bytes_after_capture,
            "live_bytes_after_replays": self.live_bytes_after_replays,
            "capture_cost_bytes": self.capture_cost_bytes,
            "reserved_bytes_after_replays": self.reserved_bytes_after_replays,
            "bytes_gained_per_replay_step": self.bytes_gained_per_replay_step,
            "growth_threshold_bytes": self.growth_threshold_bytes,
            "unfreed_replay_sites": [s.to_dict() for s in self.unfreed_replay_sites],
            "allocated_over_reserved": round(self.allocated_over_reserved, 4),
            "phase_tags_found": self.phase_tags_found,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryReport:
        """Inverse of to_dict (derived fields such as `summary` are recomputed, not read)."""
        values = {name: data[name] for name in cls.__dataclass_fields__
                  if name not in ("graph_pools", "unfreed_replay_sites", "notes")}
        return cls(**values,
                   graph_pools=tuple(PoolBytes.from_dict(p) for p in data.get("graph_pools", ())),
                   unfreed_replay_sites=tuple(UnfreedSite.from_dict(u)
                                              for u in data.get("unfreed_replay_sites", ())),
                   notes=tuple(data.get("notes", ())))

    def summary(self) -> str:
        """One line, e.g. `memory ok: graph pools 100.0 MiB, peak reserved 1.85x eager, +0 B/replay`."""
        parts = [f"memory {self.verdict}: graph pools {_fmt(self.graph_pool_reserved_bytes)}"]
        if self.eager_peak_reserved_bytes:
            parts.append(f"peak reserved {self.peak_reserved_bytes / self.eager_peak_reserved_bytes:.2f}x eager")
        else:
            parts.append(f"peak reserved {_fmt(self.peak_reserved_bytes)}")
        parts.append(f"{_fmt(round(self.bytes_gained_per_replay_step), signed=True)}/replay step")
        suspects = [s for s in self.unfreed_replay_sites if s.is_suspect]
        theirs = [s for s in suspects if not is_graphdoctor_site(s.site)]
        if theirs:
            parts.append(f"{len(theirs)} site(s) keep replay allocations alive, top {theirs[0].site}")
        elif suspects:
            parts.append(f"{len(suspects)} site(s) of graphdoctor's own keep replay allocations alive")
        return ", ".join(parts)


def _fmt(num: int, *, signed: bool = False) -> str:
    sign = "+" if signed and num >= 0 else ""
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    return f"{sign}{num} B"


def _as_snapshot(snap: dict[str, Any] | Snapshot) -> Snapshot:
    return snap if isinstance(snap, Snapshot) else parse_snapshot(snap)


def graph_pools(snapshot: Snapshot) -> tuple[PoolBytes, ...]:
    """Reserved and live bytes per private pool (segment_pool_id != (0, 0)), largest first."""
    acc: dict[tuple[int, int], list[int]] = {}
    for seg in snapshot.segments:
        if seg.is_graph_pool:
            row = acc.setdefault(seg.pool, [0, 0])
            row[0] += seg.total_bytes
            row[1] += sum(b.size_bytes for b in seg.blocks if b.is_live)
    pools = [PoolBytes(pool, reserved, live) for pool, (reserved, live) in acc.items()]
    return tuple(sorted(pools, key=lambda p: (-p.reserved_bytes, p.pool)))


def unfreed_replay_allocations(
    snapshot: Snapshot, *, all_frames: bool = False, min_steps: int = DEFAULT_MIN_UNFREED_STEPS,
    run_grows: bool = False,
) -> tuple[bool, tuple[UnfreedSite, ...]]:
    """Allocations tagged with a 'replay*' phase that were never freed and are still live.

    Args:
        snapshot: The snapshot taken after the replay steps (its trace must cover them).
        all_frames: Group by whole stacks rather than the first user frame.
        min_steps: Distinct replay tags (or, with untagged steps, allocations) that make a suspect.
        run_grows: The run's live bytes grow per replay step (measured over all replay steps). A
            trace covering no more than `min_steps` replay steps (diff records two) cannot show
            `min_steps` settled steps; a site then is a suspect when allocations from every
            recorded replay step are alive and the run grows.

    Returns:
        (whether any replay tag was seen, sites: user and library sites before graphdoctor's own,
        suspects first, largest first).
    """
    pending: dict[int, dict[str, Any]] = {}
    seen_tag = False
    last_tag: str | None = None
    all_tags: set[str] = set()
    for entry in snapshot.trace:
        action = entry.get("action")
        if action == "alloc":
            if phase_family(entry.get("user_metadata") or "") == REPLAY_PHASE:
                seen_tag = True
                last_tag = entry.get("user_metadata")
                all_tags.add(str(last_tag))
                pending[entry.get("addr", 0)] = entry
            else:
                pending.pop(entry.get("addr", 0), None)
        elif action in ("free_requested", "free_completed"):
            pending.pop(entry.get("addr", 0), None)
    live = {b.address: b.size_bytes for _, b in snapshot.live_blocks()}
    namer, cache = SiteNamer(all_frames=all_frames), FrameCache()
    groups: dict[str, list[Any]] = {}
    for addr, entry in pending.items():
        if live.get(addr) != entry.get("size"):
            continue  # reused or freed outside the recorded window: not provably the same tensor
        frames = frames_from_raw(entry.get("frames") or [], cache)
        row = groups.setdefault(namer.site(frames), [0, 0, set(), frames])
        row[0] += 1
        row[1] += entry.get("size", 0)
        row[2].add(entry.get("user_metadata"))
    sites = []
    for site, (num, size, tags, frames) in groups.items():
        num_steps = len(tags)
        indexed = any(":" in t for t in tags)
        # The newest replay step's tensors are naturally still alive when the snapshot is taken;
        # only steps before it can prove a leak.
        settled = len(tags - {last_tag}) if indexed else num
        short_trace = indexed and 2 <= len(all_tags) <= min_steps
        suspect = settled >= min_steps or (run_grows and short_trace and tags >= all_tags)
        shown = tuple(f.label() for f in user_frames_first(frames)[:_MAX_FRAMES])
        sites.append(UnfreedSite(site, num, size, num_steps, suspect, shown))
    sites.sort(key=lambda s: (is_graphdoctor_site(s.site), not s.is_suspect, -s.live_bytes, s.site))
    return seen_tag, tuple(sites)


def analyze_run(
    before_capture: dict[str, Any] | Snapshot,
    after_capture: dict[str, Any] | Snapshot,
    after_replays: dict[str, Any] | Snapshot,
    *,
    num_replay_steps: int,
    eager_peak_allocated_bytes: int | None,
    eager_peak_reserved_bytes: int | None,
    peak_allocated_bytes: int,
    peak_reserved_bytes: int,
    growth_threshold_bytes: int = DEFAULT_GROWTH_THRESHOLD_BYTES,
    min_unfreed_steps: int = DEFAULT_MIN_UNFREED_STEPS,
    all_frames: bool = False,
    replay_live_bytes: list[int] | None = None,
) -> MemoryReport:
    """Analyze the three snapshots of one graphed run.

    Args:
        before_capture: Snapshot dict taken after warmup, just before capture.
        after_capture: Snapshot dict taken right after capture (graph pool populated).
        after_replays: Snapshot dict taken after the replay steps; its trace should cover them,
            with allocations tagged 'replay' or 'replay:<step>' (recorder.set_phase).
        num_replay_steps: Replay steps between after_capture and after_replays.
        eager_peak_allocated_bytes: Peak allocated bytes of the eager reference run, if known.
        eager_peak_reserved_bytes: Peak reserved bytes of the eager reference run, if known.
        peak_allocated_bytes: Peak allocated bytes of the graphed run (torch.cuda.memory_stats).
        peak_reserved_bytes: Peak reserved bytes of the graphed run.
        growth_threshold_bytes: Bytes gained per replay step above which the verdict is 'growth'.
        min_unfreed_steps: See unfreed_replay_allocations.
        all_frames: Group unfreed allocations by whole stacks.
        replay_live_bytes: Allocated bytes at the end of each replay step (memory_allocated()).
            With two or more, bytes gained per replay step is their slope from the first replay
            on, so one-off costs of the first replay (lazy buffers) do not read as growth.

    Returns:
        The MemoryReport; verdict 'growth' when live bytes grow past the threshold per replay step
        or a site keeps allocations from several replay steps alive, else 'ok'.

    Raises:
        UsageError: num_replay_steps < 1 or a negative threshold.
        InputFileError: a snapshot dict is malformed.
    """
    if num_replay_steps < 1:
        raise UsageError(f"num_replay_steps: got {num_replay_steps}, expected >= 1")
    if growth_threshold_bytes < 0:
        raise UsageError(f"growth_threshold_bytes: got {growth_threshold_bytes}, expected >= 0")
    snaps = tuple(_as_snapshot(s) for s in (before_capture, after_capture, after_replays))
    return _report(
        *snaps,
        num_replay_steps=num_replay_steps,
        peaks=(peak_allocated_bytes, peak_reserved_bytes, eager_peak_allocated_bytes, eager_peak_reserved_bytes),
        growth_threshold_bytes=growth_threshold_bytes,
        min_unfreed_steps=min_unfreed_steps,
        all_frames=all_frames,
        replay_live_bytes=replay_live_bytes,
    )


def replay_slope(live: list[int], threshold: int) -> tuple[float, str]:
    """(bytes gained per replay step, how it was measured) from the allocated bytes after each replay step.

    The slope over every replay step, less its one largest single-step change when there are three or more: a
    one-off allocation in the middle of the replays (an optimizer's state, made at its first update after fp16's
    skipped steps) is not growth per replay, while a leak of every step or of every other step still shows.
    """
    steps = len(live) - 1
    changes = [b - a for a, b in zip(live, live[1:], strict=False)]
    if steps < 2:
        return float(live[-1] - live[0]) / steps, (f"bytes gained per replay step: slope of allocated bytes over "
                                                    f"{len(live)} replay steps")
    largest = max(range(steps), key=lambda i: abs(changes[i]))
    gained = (live[-1] - live[0] - changes[largest]) / (steps - 1)
    note = (f"bytes gained per replay step: slope of allocated bytes over {len(live)} replay steps, less the largest "
            "single-step change")
    if changes[largest] > threshold and gained <= threshold:
        note += (f"; one step gained {_fmt(changes[largest])} once (between replay steps {largest + 1} and "
                 f"{largest + 2} of {len(live)}): a one-off allocation, such as an optimizer's state made at its "
                 "first update after fp16's skipped steps, not growth per replay")
    return gained, note


def _report(
    before: Snapshot,
    captured: Snapshot,
    replayed: Snapshot,
    *,
    num_replay_steps: int,
    peaks: tuple[int, int, int | None, int | None],
    growth_threshold_bytes: int,
    min_unfreed_steps: int,
    all_frames: bool,
    replay_live_bytes: list[int] | None = None,
) -> MemoryReport:
    peak_allocated_bytes, peak_reserved_bytes, eager_peak_allocated_bytes, eager_peak_reserved_bytes = peaks
    end = totals(replayed)
    live_after_capture = totals(captured).live_bytes
    gained = (end.live_bytes - live_after_capture) / num_replay_steps
    notes = []
    if replay_live_bytes is not None and len(replay_live_bytes) >= 2:
        gained, note = replay_slope(replay_live_bytes, growth_threshold_bytes)
        notes.append(note)
    tags_found, sites = unfreed_replay_allocations(replayed, all_frames=all_frames, min_steps=min_unfreed_steps,
                                                   run_grows=gained > growth_threshold_bytes)
    if not tags_found:
        notes.append("no 'replay' phase tags in the trace: allocations during replay were not checked")
    if not replayed.trace:
        notes.append("after_replays snapshot has no trace: memory history was not recording")
    growth = gained > growth_threshold_bytes or any(s.is_suspect for s in sites)
    pools = graph_pools(replayed)
    return MemoryReport(
        verdict="growth" if growth else "ok",
        num_replay_steps=num_replay_steps,
        graph_pool_reserved_bytes=sum(p.reserved_bytes for p in pools),
        graph_pools=pools,
        peak_allocated_bytes=peak_allocated_bytes,
        peak_reserved_bytes=peak_reserved_bytes,
        eager_peak_allocated_bytes=eager_peak_allocated_bytes,
        eager_peak_reserved_bytes=eager_peak_reserved_bytes,
        live_bytes_before_capture=totals(before).live_bytes,
        live_bytes_after_capture=live_after_capture,
        live_bytes_after_replays=end.live_bytes,
        reserved_bytes_after_replays=end.reserved_bytes,
        bytes_gained_per_replay_step=gained,
        growth_threshold_bytes=growth_threshold_bytes,
        unfreed_replay_sites=sites,
        allocated_over_reserved=end.allocated_over_reserved,
        phase_tags_found=tags_found,
        notes=tuple(notes),
    )


__all__ = [
    "DEFAULT_GROWTH_THRESHOLD_BYTES",
    "DEFAULT_MIN_UNFREED_STEPS",
    "REPLAY_PHASE",
    "MemoryReport",
    "PoolBytes",
    "UnfreedSite",
    "analyze_run",
    "graph_pools",
    "replay_slope",
    "unfreed_replay_allocations",
]
