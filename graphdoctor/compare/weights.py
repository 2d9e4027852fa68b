"""Whether the children of one diff started from the same weights: the digests gpu_init children report
(graphdoctor.child.weights), compared across records."""

from __future__ import annotations

from graphdoctor.protocol.record import RunRecord


def weights_disagree(records: list[RunRecord]) -> str | None:
    """One line naming the children whose initial weights differ from the first's, or whose initialisation left
    parameters unseeded; None when every child that reported its weights agrees (or none reported them)."""
    reported = [r for r in records if r.weights is not None]
    if not reported:
        return None
    first = reported[0]
    assert first.weights is not None
    differ = [r.name or r.impl for r in reported[1:] if r.weights is not None and r.weights.digest != first.weights.digest]
    unseeded = sorted({n for r in reported if r.weights is not None for n in r.weights.unseeded})
    parts = []
    if differ:
        parts.append(f"initial weights differ from {first.name or first.impl}'s in {', '.join(differ)}")
    if unseeded:
        parts.append(f"parameters not seeded per name: {', '.join(unseeded[:5])}"
                     + (f" and {len(unseeded) - 5} more" if len(unseeded) > 5 else ""))
    return "; ".join(parts) or None


__all__ = ["weights_disagree"]
