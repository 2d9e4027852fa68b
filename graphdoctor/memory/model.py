"""Typed view of a torch 2.11 CUDA memory snapshot: segments, blocks, frames and trace events.

Built from the raw dict returned by the loader (or by torch.cuda.memory._snapshot() in a child
process); validates the fields graphdoctor reads and names the field when one is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from graphdoctor.errors import InputFileError

DEFAULT_POOL: tuple[int, int] = (0, 0)
"""segment_pool_id of the caching allocator's default pool; anything else is a private (graph) pool."""

LIVE_STATES = frozenset({"active_allocated", "active_pending_free"})
"""Block states that hold memory for a tensor (pending-free blocks still wait on a stream)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame of an allocation, as recorded by the allocator."""

    filename: str
    line: int
    name: str

    def label(self) -> str:
        """Short `file.py:LINE name` form (last two path components)."""
        tail = "/".join(self.filename.replace("\\", "/").split("/")[-2:])
        return f"{tail}:{self.line} {self.name}"


@dataclass(frozen=True, slots=True)
class Block:
    """A piece of a segment: a live tensor allocation or cached free space."""

    address: int
    size_bytes: int
    requested_bytes: int
    state: str
    frames: tuple[Frame, ...]

    @property
    def is_live(self) -> bool:
        """True when the block holds memory for a tensor (allocated or pending free)."""
        return self.state in LIVE_STATES


@dataclass(frozen=True, slots=True)
class Segment:
    """One cudaMalloc'd (or mapped) region owned by the caching allocator."""

    device: int
    address: int
    total_bytes: int
    allocated_bytes: int
    stream: int
    segment_type: str
    pool: tuple[int, int]
    blocks: tuple[Block, ...]

    @property
    def is_graph_pool(self) -> bool:
        """True for segments of a private pool (CUDA graph capture or MemPool)."""
        return self.pool != DEFAULT_POOL


class TraceEvent(NamedTuple):
    """One allocator history entry; frames stay raw until a caller asks (see frames_from_raw)."""

    action: str
    addr: int
    size_bytes: int
    stream: int
    time_us: int
    phase: str
    raw_frames: list[Any]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A parsed snapshot: typed segments plus the raw trace of the device with the most history."""

    segments: tuple[Segment, ...]
    trace: list[dict[str, Any]]
    trace_device: int
    allocator_settings: dict[str, Any]

    @property
    def num_blocks(self) -> int:
        """Number of blocks over all segments."""
        return sum(len(seg.blocks) for seg in self.segments)

    def live_blocks(self) -> Iterator[tuple[Segment, Block]]:
        """Yield (segment, block) for every live block."""
        for seg in self.segments:
            for block in seg.blocks:
                if block.state in LIVE_STATES:
                    yield seg, block

    def events(self) -> Iterator[TraceEvent]:
        """Yield the trace entries in recorded (chronological) order."""
        for entry in self.trace:
            yield TraceEvent(
                entry.get("action", ""),
                entry.get("addr", 0) or 0,
                entry.get("size", 0) or 0,
                entry.get("stream", 0) or 0,
                entry.get("time_us", 0) or 0,
                entry.get("user_metadata", "") or "",
                entry.get("frames") or [],
            )


def pool_label(pool: tuple[int, int]) -> str:
    """Human label of a pool id: 'default' for (0,0), else 'graph a,b'."""
    return "default" if pool == DEFAULT_POOL else f"graph {pool[0]},{pool[1]}"


class FrameCache:
    """Converts raw frame dicts to Frame once; torch shares frame dicts across entries."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, Frame]] = {}

    def frames(self, raw: Any, where: str) -> tuple[Frame, ...]:
        if not raw:
            return ()
        if not isinstance(raw, list):
            raise InputFileError(f"{where}.frames: got {type(raw).__name__}, expected a list")
        out = []
        for item in raw:
            hit = self._by_id.get(id(item))
            if hit is None:
                if not isinstance(item, dict):
                    raise InputFileError(f"{where}.frames: got {type(item).__name__} entry, expected a dict")
                frame = Frame(str(item.get("filename", "??")), _as_int(item.get("line", 0)), str(item.get("name", "??")))
                # Keep the raw dict referenced so its id() cannot be reused while cached.
                self._by_id[id(item)] = (item, frame)
            else:
                frame = hit[1]
            out.append(frame)
        return tuple(out)


def frames_from_raw(raw: list[Any], cache: FrameCache | None = None) -> tuple[Frame, ...]:
    """Convert a raw trace-entry frame list to Frames; pass one FrameCache for many entries."""
    return (cache or FrameCache()).frames(raw, "trace entry")


def _as_int(value: Any) -> int:
    return value if isinstance(value, int) else int(value or 0)


def _field(raw: dict[str, Any], key: str, where: str) -> Any:
    try:
        return raw[key]
    except KeyError:
        raise InputFileError(f"{where}: field '{key}' missing; not a torch CUDA memory snapshot") from None
    except TypeError:
        raise InputFileError(f"{where}: got {type(raw).__name__}, expected a dict") from None


def _parse_pool(raw: Any, where: str) -> tuple[int, int]:
    if raw is None:
        return DEFAULT_POOL
    if isinstance(raw, (tuple, list)) and len(raw) == 2 and all(isinstance(v, int) for v in raw):
        return (raw[0], raw[1])
    raise InputFileError(f"{where}.segment_pool_id: got {raw!r}, expected a (int, int) tuple")


def _parse_block(raw: dict[str, Any], where: str, cache: FrameCache) -> Block:
    size = _field(raw, "size", where)
    if not isinstance(size, int) or size < 0:
        raise InputFileError(f"{where}.size: got {size!r}, expected a non-negative int")
    return Block(
        address=_as_int(_field(raw, "address", where)),
        size_bytes=size,
        requested_bytes=_as_int(raw.get("requested_size", size)),
        state=str(_field(raw, "state", where)),
        frames=cache.frames(raw.get("frames"), where),
    )


def _parse_segment(raw: dict[str, Any], index: int, cache: FrameCache) -> Segment:
    where = f"segments[{index}]"
    raw_blocks = _field(raw, "blocks", where)
    if not isinstance(raw_blocks, list):
        raise InputFileError(f"{where}.blocks: got {type(raw_blocks).__name__}, expected a list")
    blocks = tuple(_parse_block(b, f"{where}.blocks[{i}]", cache) for i, b in enumerate(raw_blocks))
    total = _field(raw, "total_size", where)
    if not isinstance(total, int) or total < 0:
        raise InputFileError(f"{where}.total_size: got {total!r}, expected a non-negative int")
    allocated = raw.get("allocated_size")
    if not isinstance(allocated, int):
        allocated = sum(b.size_bytes for b in blocks if b.state == "active_allocated")
    return Segment(
        device=_as_int(raw.get("device", 0)),
        address=_as_int(_field(raw, "address", where)),
        total_bytes=total,
        allocated_bytes=allocated,
        stream=_as_int(raw.get("stream", 0)),
        segment_type=str(raw.get("segment_type", "unknown")),
        pool=_parse_pool(raw.get("segment_pool_id"), where),
        blocks=blocks,
    )


def _pick_trace(raw_traces: Any) -> tuple[int, list[dict[str, Any]]]:
    if raw_traces is None:
        return 0, []
    if not isinstance(raw_traces, list):
        raise InputFileError(f"device_traces: got {type(raw_traces).__name__}, expected a list per device")
    best_device: int = 0
    best: list[Any] = []
    for device, entries in enumerate(raw_traces):
        if not isinstance(entries, list):
            raise InputFileError(f"device_traces[{device}]: got {type(entries).__name__}, expected a list")
        if len(entries) > len(best):
            best_device, best = device, entries
    for i in (0, len(best) - 1) if best else ():
        if not isinstance(best[i], dict) or "action" not in best[i]:
            raise InputFileError(f"device_traces[{best_device}][{i}]: expected a dict with 'action'")
    return best_device, best


def parse_snapshot(raw: dict[str, Any]) -> Snapshot:
    """Validate and convert a raw snapshot dict.

    Args:
        raw: The dict from load_snapshot or torch.cuda.memory._snapshot().

    Returns:
        The typed Snapshot; trace entries stay as the raw dicts (read through Snapshot.events()).

    Raises:
        InputFileError: a field graphdoctor reads is missing or has the wrong type.
    """
    raw_segments = _field(raw, "segments", "snapshot")
    if not isinstance(raw_segments, list):
        raise InputFileError("snapshot.segments: expected a list")
    cache = FrameCache()
    segments = tuple(_parse_segment(seg, i, cache) for i, seg in enumerate(raw_segments))
    device, trace = _pick_trace(raw.get("device_traces"))
    settings = raw.get("allocator_settings")
    return Snapshot(
        segments=segments,
        trace=trace,
        trace_device=device,
        allocator_settings=settings if isinstance(settings, dict) else {},
    )


__all__ = [
    "DEFAULT_POOL",
    "LIVE_STATES",
    "Block",
    "Frame",
    "FrameCache",
    "Segment",
    "Snapshot",
    "TraceEvent",
    "frames_from_raw",
    "parse_snapshot",
    "pool_label",
]
