"""Safe loading of CUDA memory snapshot pickles (torch.cuda.memory._snapshot / _dump_snapshot).

A snapshot is never given to pickle.load: the unpickler refuses every global, so a hostile file can
build dicts, lists, strings and numbers but cannot import or call anything. Sizes are capped.
"""

from __future__ import annotations

import gc
import gzip
import io
import os
import pickle
from pathlib import Path
from typing import Any, BinaryIO

from graphdoctor.errors import InputFileError

DEFAULT_MAX_BYTES = 4 << 30
"""Default cap on a snapshot's (decompressed) size: 4 GiB."""

_GZIP_MAGIC = b"\x1f\x8b"

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
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputFileError(f"snapshot {path}: cannot read ({exc.strerror or exc})") from None
    if not path.is_file():
        raise InputFileError(f"snapshot {path}: not a regular file")
    if size == 0:
        raise InputFileError(f"snapshot {path}: empty file")
    if size > max_bytes:
        raise InputFileError(
            f"snapshot {path}: {size} bytes exceeds the cap of {max_bytes} bytes "
            "(raise max_bytes / --max-bytes if the file is trusted)"
        )
    return size


def _unpickle_stream(stream: BinaryIO, where: str) -> Any:
    # A snapshot is millions of acyclic dicts and lists: the cyclic GC would rescan them again and
    # again while they are built (a third of the load time) and can free nothing.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
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
    finally:
        if gc_was_enabled:
            gc.enable()


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
    try:
        with open(file_path, "rb") as raw:
            if raw.read(2) == _GZIP_MAGIC:
                raw.seek(0)
                with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                    capped = io.BufferedReader(_CappedReader(unzipped, max_bytes), 1 << 20)  # type: ignore[arg-type]
                    data = _unpickle_stream(capped, where)
            else:
                raw.seek(0)
                data = _unpickle_stream(raw, where)
    except OSError as exc:
        raise InputFileError(f"{where}: cannot read ({exc.strerror or exc})") from None
    return _normalize_top(data, where)


def loads_snapshot(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """Load a snapshot from bytes in memory (plain or gzip pickle); same rules as load_snapshot.

    Raises:
        InputFileError: too large, truncated, corrupt, or asking for any global.
    """
    if len(data) > max_bytes:
        raise InputFileError(f"snapshot: {len(data)} bytes exceeds the cap of {max_bytes} bytes")
    if data[:2] == _GZIP_MAGIC:
        stream: BinaryIO = io.BufferedReader(_CappedReader(gzip.GzipFile(fileobj=io.BytesIO(data)), max_bytes))  # type: ignore[arg-type]
    else:
        stream = io.BytesIO(data)
    return _normalize_top(_unpickle_stream(stream, "snapshot"), "snapshot")


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


__all__ = ["DEFAULT_MAX_BYTES", "load_snapshot", "loads_snapshot", "save_snapshot"]
