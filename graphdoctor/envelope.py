"""The one JSON envelope of every graphdoctor JSON document: schema_version, tool, command, payload.

`envelope()` wraps a command's payload; `open_envelope()` reads any graphdoctor document back,
including the schema 1 documents written before the envelope (docs/json.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphdoctor.errors import InputFileError, UsageError

SCHEMA_VERSION = 2
"""Version of the envelope and of the payloads inside it (1: the per-command documents before it)."""

TOOL_NAME = "graphdoctor"
ENVELOPE_KEYS: tuple[str, ...] = ("schema_version", "tool", "command")
LEGACY_KEYS: tuple[str, ...] = ("schema_version", "tool")
"""Keys the schema 1 documents carried themselves (`"tool": "graphdoctor diff"`); the envelope
replaces them."""


def tool_info() -> dict[str, str]:
    """`{"name": "graphdoctor", "version": "<installed version>"}`."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version(TOOL_NAME)
    except PackageNotFoundError:  # running from a source tree that was never installed
        installed = "unknown"
    return {"name": TOOL_NAME, "version": installed}


def envelope(command: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Wrap `payload` as `{"schema_version": 2, "tool": {...}, "command": command, **payload}`.

    The `schema_version` and `tool` a pre-envelope payload carries (LEGACY_KEYS) are replaced.

    Raises:
        UsageError: the payload has a `command` key of its own.
    """
    if "command" in payload:
        raise UsageError("envelope: payload key 'command' is reserved by the envelope")
    body = {k: v for k, v in payload.items() if k not in LEGACY_KEYS}
    return {"schema_version": SCHEMA_VERSION, "tool": tool_info(), "command": command, **body}


@dataclass(frozen=True, slots=True)
class Envelope:
    """A graphdoctor JSON document read back."""

    schema_version: int
    command: str
    """`diff`, `check`, ... ; for schema 1 documents the command given by the caller."""
    payload: dict[str, Any]
    tool: dict[str, str]


def open_envelope(data: Mapping[str, Any], *, legacy_command: str) -> Envelope:
    """Read a graphdoctor JSON document: schema 2 (enveloped) or schema 1 (bare payload).

    Args:
        data: the parsed JSON object.
        legacy_command: the command a schema 1 document came from (it did not say).

    Raises:
        InputFileError: not a mapping with schema_version 1 or 2.
    """
    version = data.get("schema_version") if isinstance(data, Mapping) else None
    if version == 1:
        payload = {k: v for k, v in data.items() if k not in LEGACY_KEYS}
        return Envelope(1, legacy_command, payload, {"name": TOOL_NAME, "version": "unknown"})
    if version != SCHEMA_VERSION:
        raise InputFileError(f"schema_version: got {version!r}, expected 1 or {SCHEMA_VERSION}")
    payload = {k: v for k, v in data.items() if k not in ENVELOPE_KEYS}
    return Envelope(SCHEMA_VERSION, str(data.get("command")), payload, dict(data.get("tool") or {}))


__all__ = ["ENVELOPE_KEYS", "LEGACY_KEYS", "SCHEMA_VERSION", "TOOL_NAME", "Envelope", "envelope", "open_envelope", "tool_info"]
