"""'Did you mean' for misspelt names: run-file keys, launch-line flags, rule codes and options.

One small home so every caller words the suggestion the same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions), case-insensitive."""
    a, b = a.lower(), b.lower()
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def closest(name: str, candidates: Iterable[str], *, cutoff: float = 0.75) -> str | None:
    """The known name closest to `name`, or None when nothing is close enough.

    A candidate is close when few edits separate it from `name` (one per five characters, at least
    one) or when difflib's similarity ratio reaches `cutoff`; the fewest edits win.

    Args:
        name: what the user typed.
        candidates: the names that exist.
        cutoff: difflib similarity ratio (0..1) that also counts as close.

    Returns:
        The closest candidate, or None.
    """
    allowed = max(1, len(name) // 5)
    best: tuple[int, float, str] | None = None
    for candidate in dict.fromkeys(candidates):
        distance = edit_distance(name, candidate)
        ratio = difflib.SequenceMatcher(None, name.lower(), candidate.lower()).ratio()
        if distance > allowed and ratio < cutoff:
            continue
        key = (distance, -ratio, candidate)
        if best is None or key < best:
            best = key
    return best[2] if best is not None else None


def did_you_mean(name: str, candidates: Iterable[str], *, cutoff: float = 0.75) -> str:
    """` (did you mean 'x'?)` for the closest candidate, or an empty string."""
    match = closest(name, candidates, cutoff=cutoff)
    return f" (did you mean {match!r}?)" if match is not None else ""


__all__ = ["closest", "did_you_mean", "edit_distance"]
