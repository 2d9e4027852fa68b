"""Typed view of a torch 2.11 CUDA memory snapshot: segments, blocks, frames and trace events.

Built from the raw dict returned by the loader (or by torch.cuda.memory._snapshot() in a child
process); validates the fields graphdoctor reads and names the field when one is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from graphdoctor.errors import InputFileError
from graphdoctor.inputs import type_error

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
            raise type_error(f"{where}.frames", "a list", raw)
        out = []
        for i, item in enumerate(raw):
            hit = self._by_id.get(id(item))
            if hit is None:
                frame = _parse_frame(item, f"{where}.frames[{i}]")
                # Keep the raw dict referenced so its id() cannot be reused while cached.
                self._by_id[id(item)] = (item, frame)
            else:
                frame = hit[1]
            out.append(frame)
        return tuple(out)


def _parse_frame(item: Any, where: str) -> Frame:
    if not isinstance(item, dict):
        raise type_error(where, "a dict", item)
    filename, name = item.get("filename", "??"), item.get("name", "??")
    if not isinstance(filename, str):
        raise type_error(f"{where}.filename", "a string", filename)
    if not isinstance(name, str):
        raise type_error(f"{where}.name", "a string", name)
    return Frame(filename, _int(item.get("line", 0), f"{where}.line"), name)


def frames_from_raw(raw: list[Any], cache: FrameCache | None = None) -> tuple[Frame, ...]:
    """Convert a raw trace-entry frame list to Frames; pass one FrameCache for many entries."""
    return (cache or FrameCache()).frames(raw, "trace entry")


MAX_INT = 1 << 64
"""Addresses, sizes, streams and line numbers are 64-bit values in every snapshot torch writes."""


def _int(value: Any, where: str, *, minimum: int = -MAX_INT) -> int:
    """A snapshot integer field: a real int (not bool, str, float), within 64 bits."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value < MAX_INT:
        raise type_error(where, "an integer" if minimum < 0 else "a non-negative integer", value)
    return value


def _str(value: Any, where: str, default: str) -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise type_error(where, "a string", value)
    return value


def _field(raw: dict[str, Any], key: str, where: str) -> Any:
    if not isinstance(raw, dict):
        raise type_error(where, "a dict", raw)
    try:
        return raw[key]
    except KeyError:
        raise InputFileError(f"{where}: field '{key}' missing; not a torch CUDA memory snapshot") from None


def _parse_pool(raw: Any, where: str) -> tuple[int, int]:
    if raw is None:
        return DEFAULT_POOL
    if isinstance(raw, (tuple, list)) and len(raw) == 2:
        return (_int(raw[0], f"{where}.segment_pool_id[0]"), _int(raw[1], f"{where}.segment_pool_id[1]"))
    raise type_error(f"{where}.segment_pool_id", "a (int, int) tuple", raw)


def _parse_block(raw: dict[str, Any], where: str, cache: FrameCache) -> Block:
    size = _int(_field(raw, "size", where), f"{where}.size", minimum=0)
    return Block(
        address=_int(_field(raw, "address", where), f"{where}.address", minimum=0),
        size_bytes=size,
        requested_bytes=_int(raw.get("requested_size", size), f"{where}.requested_size", minimum=0),
        state=_str(_field(raw, "state", where), f"{where}.state", "unknown"),
        frames=cache.frames(raw.get("frames"), where),
    )


def _parse_segment(raw: dict[str, Any], index: int, cache: FrameCache) -> Segment:
    where = f"segments[{index}]"
    raw_blocks = _field(raw, "blocks", where)
    if not isinstance(raw_blocks, list):
        raise type_error(f"{where}.blocks", "a list", raw_blocks)
    blocks = tuple(_parse_block(b, f"{where}.blocks[{i}]", cache) for i, b in enumerate(raw_blocks))
    total = _int(_field(raw, "total_size", where), f"{where}.total_size", minimum=0)
    allocated = raw.get("allocated_size")
    if allocated is None:
        allocated = sum(b.size_bytes for b in blocks if b.state == "active_allocated")
    return Segment(
        device=_int(raw.get("device", 0), f"{where}.device"),
        address=_int(_field(raw, "address", where), f"{where}.address", minimum=0),
        total_bytes=total,
        allocated_bytes=_int(allocated, f"{where}.allocated_size", minimum=0),
        stream=_int(raw.get("stream", 0), f"{where}.stream"),
        segment_type=_str(raw.get("segment_type"), f"{where}.segment_type", "unknown"),
        pool=_parse_pool(raw.get("segment_pool_id"), where),
        blocks=blocks,
    )


def _pick_trace(raw_traces: Any) -> tuple[int, list[dict[str, Any]]]:
    if raw_traces is None:
        return 0, []
    if not isinstance(raw_traces, list):
        raise type_error("device_traces", "a list per device", raw_traces)
    best_device: int = 0
    best: list[Any] = []
    for device, entries in enumerate(raw_traces):
        if not isinstance(entries, list):
            raise type_error(f"device_traces[{device}]", "a list", entries)
        if len(entries) > len(best):
            best_device, best = device, entries
    for i, entry in enumerate(best):
        _check_trace_entry(entry, f"device_traces[{best_device}][{i}]")
    return best_device, best


def _check_trace_entry(entry: Any, where: str) -> None:
    """Type-check the fields the analyses read, so they can use entry.get() without surprises.

    Frames are checked when converted (frames_from_raw); here only that they are a list.
    """
    if not isinstance(entry, dict) or "action" not in entry:
        raise type_error(where, "a dict with 'action'", entry)
    if not isinstance(entry["action"], str):
        raise type_error(f"{where}.action", "a string", entry["action"])
    for key, minimum in _TRACE_INT_KEYS:
        value = entry.get(key, 0)
        if type(value) is not int or not minimum <= value < MAX_INT:
            _int(value, f"{where}.{key}", minimum=minimum)  # raises the typed error
    tag = entry.get("user_metadata")
    if tag is not None and not isinstance(tag, str):
        raise type_error(f"{where}.user_metadata", "a string", tag)
    frames = entry.get("frames")
    if frames is not None and not isinstance(frames, list):
        raise type_error(f"{where}.frames", "a list", frames)


_TRACE_INT_KEYS = (("addr", 0), ("size", 0), ("stream", -MAX_INT), ("time_us", -MAX_INT))


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
        raise type_error("segments", "a list", raw_segments)
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
