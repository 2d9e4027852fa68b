"""What ChildSchedule asks of its ChildSession beyond run_request, for the recorded sessions of unit tests: a child
submitted is run when its result is first read (so a test's request list holds only what the decision tree
read, in order), cancelling is a no-op, and no gate is set."""

from __future__ import annotations

from typing import Any


class Deferred:
    """A submitted request, run by `run` when its result is first read."""

    def __init__(self, run: Any, request: Any) -> None:
        self._run, self._request = run, request
        self._done = False
        self._result: Any = None

    def result(self) -> Any:
        if not self._done:
            self._result, self._done = self._run(self._request), True
        return self._result

    def cancel(self) -> bool:
        return not self._done

    def cancelled(self) -> bool:
        return False

    def exception(self) -> None:
        return None


class DeferredSession:
    """Mixin: submit, cancel, close and gate over the class's run_request."""

    gate: str | None = None

    @property
    def jobs_line(self) -> str:
        return self.plan.reason  # type: ignore[attr-defined, no-any-return]

    def submit(self, request: Any) -> Deferred:
        return Deferred(self.run_request, request)  # type: ignore[attr-defined]

    def cancel(self, futures: list[Any], *, wait: bool = True) -> None:
        del futures, wait

    def close(self) -> None:
        return None


__all__ = ["Deferred", "DeferredSession"]
