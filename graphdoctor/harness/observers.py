"""Step observers a child attaches to its training loop: memory recording and launch profiling.

Each observer sees begin_step/end_step with the step's phase and returns its report section from
finish(); the section lands in the child's `end` event and then in the report's JSON.
"""

from __future__ import annotations

from typing import Any

from graphdoctor.harness.spec import ChildSpec


class Observer:
    """Base observer: does nothing, reports nothing."""

    def begin_step(self, step: int, phase: str) -> None:
        """Called before a step's forward_backward."""

    def end_step(self, step: int, phase: str) -> None:
        """Called after a step's optimizer step."""

    def finish(self) -> dict[str, Any]:
        """Report section(s) to merge into the child's end event."""
        return {}


def make_observers(spec: ChildSpec) -> tuple[Observer, ...]:
    """Observers this child needs, from its spec."""
    return ()


__all__ = ["Observer", "make_observers"]
