"""Comparing a live analysis with one recorded on the H200 before the analysis gained fields."""

from __future__ import annotations

from typing import Any


def as_recorded(live: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """`live` restricted to the keys the recording has: the fields it predates (the backward-side
    localization's, for tap tables recorded without input-gradient taps) are left out."""
    return {key: value for key, value in live.items() if key in recorded}
