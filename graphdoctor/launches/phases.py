"""NVTX + profiler phase ranges: eager / warmup / capture / replay, per implementation and step.

Each range is an NVTX push/pop in domain "graphdoctor" (category = phase, payload = step) and,
while a torch profiler is recording, a `record_function("graphdoctor/<impl>/<phase>/<step>")` so
Kineto traces carry the same phases. Imports on CPU-only machines; torch is imported lazily.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

try:
    import nvtx
except ImportError:  # nvtx is a declared dependency; without it only the NVTX half is skipped
    nvtx = None

from graphdoctor.errors import UsageError
from graphdoctor.launches.counts import PHASES

DOMAIN_NAME = "graphdoctor"
LABEL_PREFIX = "graphdoctor/"
_PHASE_COLORS = {"eager": "blue", "warmup": "yellow", "capture": "red", "replay": "green"}

# Attributes are built once per (impl, phase); only the payload (step) changes per range.
_attributes: dict[tuple[str, str], Any] = {}
_domain: Any = None


def phase_label(impl: str, name: str, step: int) -> str:
    """The record_function name of a phase range, parsed back by the launch accounting.

    Args:
        impl: Implementation name, e.g. "eager", "local", "full_iteration".
        name: One of "eager", "warmup", "capture", "replay".
        step: Training step index.

    Returns:
        "graphdoctor/<impl>/<name>/<step>".
    """
    return f"{LABEL_PREFIX}{impl}/{name}/{step}"


def _nvtx_attributes(impl: str, name: str) -> Any:
    global _domain
    key = (impl, name)
    attributes = _attributes.get(key)
    if attributes is None and key not in _attributes:
        if nvtx is None:
            return None
        if _domain is None:
            _domain = nvtx.get_domain(DOMAIN_NAME)
        # DummyDomain (no tool attached / NVTX_DISABLE) returns None here; push_range(None) is a no-op.
        attributes = _domain.get_event_attributes(
            message=f"{impl}/{name}",
            color=_PHASE_COLORS[name],
            category=_domain.get_category_id(name),
        )
        _attributes[key] = attributes
    return attributes


def _profiler_recording() -> bool:
    """True when a torch autograd/Kineto profiler is active (torch already imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return bool(torch._C._autograd._profiler_enabled())


class PhaseRange:
    """Context manager returned by phase(); reusable but not re-entrant."""

    __slots__ = ("_attributes", "_impl", "_name", "_record", "_step")

    def __init__(self, impl: str, name: str, step: int) -> None:
        if name not in _PHASE_COLORS:
            raise UsageError(f"phase: name got {name!r}, expected one of {', '.join(PHASES)}")
        if not impl:
            raise UsageError(f"phase: impl got {impl!r}, expected a non-empty name")
        self._attributes = _nvtx_attributes(impl, name)
        self._impl = impl
        self._name = name
        self._step = step
        self._record: Any = None

    def __enter__(self) -> PhaseRange:
        attributes = self._attributes
        if attributes is not None:
            attributes.payload = self._step
            _domain.push_range(attributes)
        if _profiler_recording():
            import torch.profiler

            label = phase_label(self._impl, self._name, self._step)
            self._record = torch.profiler.record_function(label)
            self._record.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._record is not None:
            self._record.__exit__(exc_type, exc, tb)
            self._record = None
        if self._attributes is not None:
            _domain.pop_range()


def phase(impl: str, name: str, step: int) -> PhaseRange:
    """Mark one phase of one step for Nsight (NVTX) and for torch.profiler traces.

    Cheap when nothing listens: with no NVTX tool attached the nvtx domain is a dummy, and the
    record_function mirror is only created while a torch profiler is recording.

    Args:
        impl: Implementation name (e.g. "local"); may contain "/" but must not be empty.
        name: Phase, one of "eager", "warmup", "capture", "replay".
        step: Step index; NVTX payload and last label component.

    Returns:
        A context manager: `with phase("local", "replay", 3): step()`.

    Raises:
        UsageError: name is not a known phase, or impl is empty.
    """
    return PhaseRange(impl, name, step)


__all__ = ["DOMAIN_NAME", "PhaseRange", "phase", "phase_label"]
