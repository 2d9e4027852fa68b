"""Safe loading of CUDA memory snapshot pickles (torch.cuda.memory._snapshot / _dump_snapshot).

A snapshot is never given to pickle.load: the unpickler refuses every global, so a hostile file can
build dicts, lists, strings and numbers but cannot import or call anything. Sizes are capped.
load_snapshot_segments stops at the allocator history (device_traces) when the file allows it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import pickle
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from graphdoctor.collector import collector_paused
from graphdoctor.errors import InputFileError
from graphdoctor.inputs import (
    MAX_GZIP_RATIO,
    expansion_budget,
    file_size,
    gunzip_capped,
    gzip_cap,
    open_regular,
    read_bytes,
)
from graphdoctor.memory.pickle_scan import scan_memo_indices

DEFAULT_MAX_BYTES = 4 << 30
"""Default cap on a snapshot's (decompressed) size: 4 GiB."""

_GZIP_MAGIC = b"\x1f\x8b"

# torch writes a snapshot with pickle protocol 4: PROTO 4, then FRAME opcodes (0x95 + 8-byte
# little-endian length) holding the top-level dict {"segments", "device_traces", ...} in that order.
_PROTO_4 = b"\x80\x04"
_FRAME = 0x95
_FRAME_HEADER_BYTES = 9
# EMPTY_DICT MEMOIZE MARK, then the first key 'segments' (SHORT_BINUNICODE + MEMOIZE).
_TOP_HEAD = b"}\x94(\x8c\x08segments\x94"
# The second key: SHORT_BINUNICODE 'device_traces' + MEMOIZE (first occurrence of the string).
_TRACES_KEY = b"\x8c\x0ddevice_traces\x94"
# SETITEMS closes the top-level MARK into the dict; STOP returns it.
_CLOSE_TOP = b"u."
_STOP = b"."
_READ_CHUNK_BYTES = 1 << 20

# Everything a malformed pickle stream can raise from the C unpickler when it holds no globals.
_PARSE_ERRORS = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    AttributeError,
    OverflowError,
    UnicodeDecodeError,
    RecursionError,
)


class _RefusedGlobal(pickle.UnpicklingError):
    """Raised by the unpickler when the stream asks for any global (class, function, module)."""


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global; real snapshots contain only builtin containers."""

    def find_class(self, module: str, name: str) -> Any:
        raise _RefusedGlobal(f"refused global {module}.{name}: snapshots contain no globals")

    def persistent_load(self, pid: Any) -> Any:
        raise _RefusedGlobal("refused persistent id: snapshots contain none")


class _CappedReader(io.RawIOBase):
    """File wrapper that raises once more than max_bytes have been read (decompression bombs)."""

    def __init__(self, inner: BinaryIO, max_bytes: int) -> None:
        super().__init__()
        self._inner = inner
        self._max_bytes = max_bytes
        self.num_read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)
        data = self._inner.read(len(view))
        num = len(data)
        self.num_read_bytes += num
        if self.num_read_bytes > self._max_bytes:
            raise InputFileError(
                f"snapshot: decompressed size exceeds the cap of {self._max_bytes} bytes "
                "(raise max_bytes / --max-bytes if the file is trusted)"
            )
        view[:num] = data
        return num


def _check_stat(path: Path, max_bytes: int) -> int:
    size = file_size(path, "snapshot")
    if size == 0:
        raise InputFileError(f"snapshot {path}: empty file")
    if size > max_bytes:
        raise InputFileError(
            f"snapshot {path}: {size} bytes exceeds the cap of {max_bytes} bytes "
            "(raise max_bytes / --max-bytes if the file is trusted)"
        )
    return size


def _unpickle_stream(stream: BinaryIO, where: str) -> Any:
    try:
        # A snapshot is millions of acyclic dicts and lists: the cyclic GC would rescan them again and
        # again while they are built (a third of the load time) and can free nothing.
        with collector_paused():
            return _NoGlobalsUnpickler(stream).load()
    except InputFileError:
        raise
    except _RefusedGlobal as exc:
        raise InputFileError(f"{where}: not a plain memory snapshot ({exc}); nothing was executed") from None
    except (gzip.BadGzipFile, EOFError) as exc:
        detail = str(exc) or "unexpected end of data"
        raise InputFileError(f"{where}: truncated or corrupt file ({detail})") from None
    except _PARSE_ERRORS as exc:
        raise InputFileError(f"{where}: not a valid snapshot pickle ({type(exc).__name__}: {exc})") from None
    except MemoryError:
        raise InputFileError(f"{where}: out of memory while loading the snapshot") from None


def load_snapshot(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """Load a snapshot pickle (plain or gzip-compressed) without executing anything.

    Args:
        path: File written by `torch.cuda.memory._dump_snapshot` or `pickle.dump(_snapshot())`,
            optionally gzip-compressed (detected from the magic bytes, not the name).
        max_bytes: Cap on the file size and on the decompressed size of a gzip file.

    Returns:
        The raw snapshot dict (`segments`, `device_traces`, ...). A bare segment list, as written by
        older `memory_snapshot()` dumps, is wrapped as `{"segments": [...], "device_traces": []}`.

    Raises:
        InputFileError: missing, too large, truncated, corrupt, or asking for any global.
    """
    if max_bytes <= 0:
        raise InputFileError(f"max_bytes: got {max_bytes}, expected a positive byte count")
    file_path = Path(path)
    _check_stat(file_path, max_bytes)
    where = f"snapshot {file_path}"
    data = read_bytes(file_path, "snapshot", max_bytes=max_bytes, flag="--max-bytes", max_ratio=_ratio(max_bytes))
    return _loads_checked(data, where)


def _ratio(max_bytes: int) -> float | None:
    # the compression-ratio check guards the default cap only; a raised cap is the user's call
    return MAX_GZIP_RATIO if max_bytes == DEFAULT_MAX_BYTES else None


def _loads_checked(data: bytes, where: str) -> dict[str, Any]:
    # The memo scan runs before the C unpickler allocates anything; the expansion check after it
    # bounds what the analysis will walk (shared references counted at every use).
    scan_memo_indices(data, where)
    snapshot = _normalize_top(_unpickle_stream(io.BytesIO(data), where), where)
    check_expansion(snapshot, where, expansion_budget(len(data)))
    return snapshot


def check_expansion(snapshot: dict[str, Any], where: str, max_values: int) -> None:
    """Refuse a snapshot whose segments, blocks, trace entries and frames, counted at every
    reference, exceed max_values: a pickle can reference one list from a million places in two
    bytes each, and the analysis visits it at every reference.

    Only the shapes the analysis walks are counted; their types are checked later by
    parse_snapshot (anything else is skipped here). Stops as soon as the budget is exceeded.

    Raises:
        InputFileError: the expanded size exceeds max_values.
    """
    total = 0

    def spend(num: int) -> None:
        nonlocal total
        total += num
        if total > max_values:
            raise InputFileError(
                f"{where}: expands to more than {max_values} values (shared references counted at every use); "
                "not a snapshot torch writes")

    for seg in _list(snapshot.get("segments")):
        blocks = _list(seg.get("blocks") if isinstance(seg, dict) else None)
        spend(1 + len(blocks))
        for block in blocks:
            spend(len(_list(block.get("frames") if isinstance(block, dict) else None)))
    for entries in _list(snapshot.get("device_traces")):
        entries = _list(entries)
        spend(1 + len(entries))
        for entry in entries:
            spend(len(_list(entry.get("frames") if isinstance(entry, dict) else None)))


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def load_snapshot_segments(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[dict[str, Any], bool]:
    """Load only a snapshot's segments when the file's layout allows it, else the whole snapshot.

    torch writes `segments` before `device_traces` (the allocator history, usually most of the
    file). When the file is a framed protocol-4 pickle in that order, the frames are read up to the
    `device_traces` key, cut there, closed into the top-level dict and loaded with the same
    no-globals unpickler; the history is never unpickled. Anything unexpected (another protocol,
    unframed data, no key, a prefix that does not load to exactly {"segments": list}) falls back to
    load_snapshot. The rest of the file is still walked frame by frame (seeking in plain files) so
    a truncated file is an error on both paths.

    Args:
        path: As for load_snapshot.
        max_bytes: As for load_snapshot; the decompressed cap counts every byte walked.

    Returns:
        (snapshot, traces_loaded): on the fast path `{"segments": [...], "device_traces": []}` and
        False; after a fallback, load_snapshot's dict and True.

    Raises:
        InputFileError: as load_snapshot (a global before the key is refused on the fast path too).
    """
    if max_bytes <= 0:
        raise InputFileError(f"max_bytes: got {max_bytes}, expected a positive byte count")
    file_path = Path(path)
    size = _check_stat(file_path, max_bytes)
    where = f"snapshot {file_path}"
    segments = None
    try:
        with _open_snapshot(file_path, max_bytes) as stream:
            found = _segments_prefix(stream)
            if found is not None and _frames_reach_stop(stream, found[1], size if stream.seekable() else None):
                scan_memo_indices(found[0], where)
                segments = _load_prefix(found[0], where)
                if segments is not None:
                    check_expansion({"segments": segments}, where, expansion_budget(len(found[0])))
    except (gzip.BadGzipFile, EOFError, zlib.error):
        pass  # truncated or corrupt gzip: the full load below reports it as load_snapshot does
    except OSError as exc:
        raise InputFileError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if segments is None:
        return load_snapshot(file_path, max_bytes=max_bytes), True
    return {"segments": segments, "device_traces": []}, False


@contextlib.contextmanager
def _open_snapshot(file_path: Path, max_bytes: int) -> Iterator[BinaryIO]:
    with open_regular(file_path, "snapshot") as raw:
        if raw.read(2) == _GZIP_MAGIC:
            raw.seek(0)
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                cap = gzip_cap(os.fstat(raw.fileno()).st_size, max_bytes, _ratio(max_bytes))
                yield io.BufferedReader(_CappedReader(unzipped, cap), 1 << 20)  # type: ignore[arg-type]
        else:
            raw.seek(0)
            yield raw


def _read_exact(stream: BinaryIO, num_bytes: int) -> bytes | None:
    # Chunked, so a hostile frame length allocates no more than the data actually there.
    chunks = []
    left = num_bytes
    while left > 0:
        chunk = stream.read(min(left, _READ_CHUNK_BYTES))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _frame_length(stream: BinaryIO) -> int | None:
    """Length of the next FRAME, or None at a clean end of data or anything but a frame header."""
    head = stream.read(_FRAME_HEADER_BYTES)
    if len(head) != _FRAME_HEADER_BYTES or head[0] != _FRAME:
        return None
    return int.from_bytes(head[1:], "little")


def _segments_prefix(stream: BinaryIO) -> tuple[bytes, bytes] | None:
    """(PROTO + the frames before the device_traces key, the last one cut there, + SETITEMS STOP,
    the last byte of the frame holding the key).

    None when the stream is not laid out as torch writes snapshots; the caller then falls back to
    a full load.
    """
    if stream.read(len(_PROTO_4)) != _PROTO_4:
        return None
    parts = [_PROTO_4]
    while True:
        length = _frame_length(stream)
        frame = None if length is None else _read_exact(stream, length)
        if frame is None:
            return None
        if len(parts) == 1 and not frame.startswith(_TOP_HEAD):
            return None
        cut = frame.find(_TRACES_KEY)
        if cut >= 0:
            parts += [bytes([_FRAME]), cut.to_bytes(8, "little"), frame[:cut], _CLOSE_TOP]
            return b"".join(parts), frame[-1:]
        parts += [bytes([_FRAME]), len(frame).to_bytes(8, "little"), frame]


def _skip(stream: BinaryIO, num_bytes: int, size: int | None) -> bytes | None:
    """Skip num_bytes and return the last one skipped; None when the data ends first."""
    if size is None:
        # gzip: decompress and drop (the cap still counts these bytes)
        left = num_bytes - 1
        while left > 0:
            chunk = stream.read(min(left, _READ_CHUNK_BYTES))
            if not chunk:
                return None
            left -= len(chunk)
    else:
        target = stream.tell() + num_bytes - 1
        if target >= size:
            return None
        stream.seek(target)
    last = stream.read(1)
    return last or None


def _frames_reach_stop(stream: BinaryIO, last_byte: bytes, size: int | None) -> bool:
    """Walk the frame headers after the key frame: True when the file ends cleanly on STOP.

    Plain files are seeked through (9 bytes read per frame); gzip streams are decompressed and
    dropped. False (fall back to the full load, which reports the problem) on a truncated file or
    data outside frames.
    """
    while True:
        head = stream.read(_FRAME_HEADER_BYTES)
        if not head:
            return last_byte == _STOP
        if len(head) != _FRAME_HEADER_BYTES or head[0] != _FRAME:
            return False
        length = int.from_bytes(head[1:], "little")
        if length == 0:
            continue
        skipped = _skip(stream, length, size)
        if skipped is None:
            return False
        last_byte = skipped


def _load_prefix(prefix: bytes, where: str) -> list[Any] | None:
    """The segments list from a cut prefix, or None when it does not load to exactly {"segments": list}."""
    try:
        with collector_paused():
            unpickler = _NoGlobalsUnpickler(io.BytesIO(prefix))
            data = unpickler.load()
            # The top-level dict is memo slot 0; anything else means the key was cut inside a
            # nested container (a 'device_traces' string first seen inside segments).
            is_top = unpickler.memo.copy().get(0) is data
    except _RefusedGlobal as exc:
        raise InputFileError(f"{where}: not a plain memory snapshot ({exc}); nothing was executed") from None
    except (*_PARSE_ERRORS, MemoryError):
        return None
    if not is_top or not isinstance(data, dict) or data.keys() != {"segments"}:
        return None
    segments = data["segments"]
    return segments if isinstance(segments, list) else None


def loads_snapshot(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """Load a snapshot from bytes in memory (plain or gzip pickle); same rules as load_snapshot.

    Raises:
        InputFileError: too large, truncated, corrupt, or asking for any global.
    """
    if len(data) > max_bytes:
        raise InputFileError(f"snapshot: {len(data)} bytes exceeds the cap of {max_bytes} bytes")
    if data[:2] == _GZIP_MAGIC:
        data = gunzip_capped(data, "snapshot", max_bytes=gzip_cap(len(data), max_bytes, _ratio(max_bytes)),
                             flag="max_bytes")
    return _loads_checked(data, "snapshot")


def _normalize_top(data: Any, where: str) -> dict[str, Any]:
    if isinstance(data, list):
        return {"segments": data, "device_traces": []}
    if not isinstance(data, dict):
        raise InputFileError(
            f"{where}: top level is {type(data).__name__}, expected a dict with 'segments' "
            "(torch.cuda.memory._snapshot())"
        )
    if not isinstance(data.get("segments"), list):
        raise InputFileError(f"{where}: field 'segments' missing or not a list; not a CUDA memory snapshot")
    return data


def save_snapshot(snapshot: dict[str, Any], path: str | os.PathLike[str], *, compress: bool | None = None) -> Path:
    """Write a snapshot dict as a pickle, gzip-compressed when compress is True or the name ends in .gz.

    Args:
        snapshot: The dict from torch.cuda.memory._snapshot().
        path: Destination file.
        compress: Force (True) or forbid (False) gzip; None decides from the file name.

    Returns:
        The path written.
    """
    out = Path(path)
    use_gzip = out.suffix == ".gz" if compress is None else compress
    out.parent.mkdir(parents=True, exist_ok=True)
    if use_gzip:
        # mtime=0 keeps the bytes reproducible for committed fixtures.
        with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as fh:
            pickle.dump(snapshot, fh, protocol=4)
    else:
        with open(out, "wb") as fh:
            pickle.dump(snapshot, fh, protocol=4)
    return out


__all__ = ["DEFAULT_MAX_BYTES", "check_expansion", "load_snapshot", "load_snapshot_segments", "loads_snapshot", "save_snapshot"]
