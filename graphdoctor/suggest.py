"""'Did you mean' for misspelt names: run-file keys, launch-line flags, rule codes and options.

One small home so every caller words the suggestion the same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, candidates: Iterable[str], *, cutoff: float = 0.75) -> str | None:
    """The known name closest to `name`, or None when nothing is close enough.

    Args:
        name: what the user typed.
        candidates: the names that exist.
        cutoff: difflib similarity ratio a candidate needs (0..1).

    Returns:
        The closest candidate, or None.
    """
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=cutoff)
    return matches[0] if matches else None


def did_you_mean(name: str, candidates: Iterable[str], *, cutoff: float = 0.75) -> str:
    """` (did you mean 'x'?)` for the closest candidate, or an empty string."""
    match = closest(name, candidates, cutoff=cutoff)
    return f" (did you mean {match!r}?)" if match is not None else ""


__all__ = ["closest", "did_you_mean"]
