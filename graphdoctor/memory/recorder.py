"""GPU side of memory analysis: record allocator history, tag phases, take snapshots, read peaks.

Feature-detects every private torch.cuda.memory API (present on torch 2.11; names may move), and
imports torch only inside the functions, so importing graphdoctor.memory never touches CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from graphdoctor.errors import NoGPUError, UsageError

DEFAULT_MAX_ENTRIES = 100_000
"""Default ring-buffer size of the allocator history (each entry costs a few hundred bytes)."""


def _memory_module() -> Any:
    import torch

    if not torch.cuda.is_available():
        raise NoGPUError("memory recording needs a CUDA GPU and torch.cuda.is_available() is False")
    return torch.cuda.memory


def history_supported() -> bool:
    """True when this torch can record allocator history and take snapshots."""
    try:
        mem = _memory_module()
    except NoGPUError:
        return False
    return hasattr(mem, "_record_memory_history") and hasattr(mem, "_snapshot")


def phases_supported() -> bool:
    """True when this torch can tag allocations with user metadata (_set_memory_metadata)."""
    try:
        mem = _memory_module()
    except NoGPUError:
        return False
    return hasattr(mem, "_set_memory_metadata")


def start_history(max_entries: int = DEFAULT_MAX_ENTRIES, *, stacks: str = "python") -> None:
    """Start recording allocator history (alloc/free events with Python stacks).

    Args:
        max_entries: Ring-buffer size; older entries are overwritten.
        stacks: 'python' (cheap, enough for sites) or 'all' (adds C++ frames).

    Raises:
        NoGPUError: no CUDA device.
        UsageError: max_entries < 1 or an unknown stacks value.
    """
    if max_entries < 1:
        raise UsageError(f"max_entries: got {max_entries}, expected >= 1")
    if stacks not in ("python", "all"):
        raise UsageError(f"stacks: got {stacks!r}, expected 'python' or 'all'")
    mem = _memory_module()
    mem._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=max_entries)


def stop_history() -> None:
    """Stop recording allocator history (the recorded entries stay until the next start)."""
    _memory_module()._record_memory_history(enabled=None)


def set_phase(name: str) -> bool:
    """Tag the allocations that follow with name (trace entries' user_metadata).

    Use 'eager', 'warmup', 'capture', 'replay' or 'replay:<step>'; '' clears the tag.

    Returns:
        False when this torch has no _set_memory_metadata (the call then does nothing).
    """
    mem = _memory_module()
    setter = getattr(mem, "_set_memory_metadata", None)
    if setter is None:
        return False
    setter(name)
    return True


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Context manager: set_phase(name) on entry, restore the previous tag on exit."""
    mem = _memory_module()
    getter = getattr(mem, "_get_memory_metadata", None)
    previous = getter() if getter is not None else ""
    set_phase(name)
    try:
        yield
    finally:
        set_phase(previous)


def take_snapshot() -> dict[str, Any]:
    """The allocator state and history now: torch.cuda.memory._snapshot().

    Synchronizes first so that frees pending on streams have completed where possible.
    """
    import torch

    mem = _memory_module()
    torch.cuda.synchronize()
    return mem._snapshot()


def pool_bytes_from_stats(device: int | None = None) -> dict[str, int]:
    """Current and peak allocated/reserved bytes from torch.cuda.memory_stats.

    Returns:
        {'allocated_bytes', 'reserved_bytes', 'active_bytes', 'peak_allocated_bytes',
        'peak_reserved_bytes', 'num_alloc_retries', 'num_ooms'}; keys are 0 when absent.
    """
    import torch

    _memory_module()
    stats = torch.cuda.memory_stats(device)
    return {
        "allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
        "reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
        "active_bytes": int(stats.get("active_bytes.all.current", 0)),
        "peak_allocated_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
        "peak_reserved_bytes": int(stats.get("reserved_bytes.all.peak", 0)),
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
    }


def reset_peaks(device: int | None = None) -> None:
    """Reset the peak counters read by pool_bytes_from_stats (between eager and graphed runs)."""
    import torch

    _memory_module()
    torch.cuda.reset_peak_memory_stats(device)


__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "history_supported",
    "phase",
    "phases_supported",
    "pool_bytes_from_stats",
    "reset_peaks",
    "set_phase",
    "start_history",
    "stop_history",
    "take_snapshot",
]
