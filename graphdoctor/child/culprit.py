"""Find the first culprit of a failed capture inside a child, and classify it.

CUDA reports an unsupported operation during capture lazily: the user's `.item()` often raises
nothing, and the capture dies later with cudaErrorStreamCaptureInvalidated at capture_end, naming the
wrong line. In culprit-hunt mode the child turns torch's sync-debug mode to "error" for exactly the
span of each capture, so a synchronizing operation raises at its own call site, with its stack; and it
runs the probes' Recorder over the same span, so the operation that raised is classified by the one
table `check --probe` uses (host sync, data-dependent shape, legacy stream, pageable copy, ...).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from graphdoctor.cuda_errors import match_known, rule_of_text
from graphdoctor.errors import exception_chain
from graphdoctor.probes.analyze import culprit_of
from graphdoctor.probes.types import Observation


class CulpritHunt:
    """Sync errors and operation recording during every CUDAGraph capture of a run.

    Args:
        module_names: id(module) -> qualified name, for the culprit's module.
    """

    def __init__(self, module_names: dict[int, str]) -> None:
        self.module_names = module_names
        self.culprit: Observation | None = None
        """The classified operation that raised first during a capture (None until one does)."""
        self.captures: list[tuple[Observation, ...]] = []
        """Everything recorded during each capture of the run, in order; the last is the failing one when a run
        fails in capture without a classified operation raising (a capture invalidated silently)."""
        self._recorder: Any = None

    def begin(self) -> None:
        """Start recording (called right after capture_begin)."""
        from graphdoctor.child.probe.recorder import Recorder
        from graphdoctor.child.probe.worker import registered_generators

        if self._recorder is not None:
            return
        self._recorder = Recorder(device_type="cuda", module_names=self.module_names,
                                  registered_generators=registered_generators(), check_streams=True)
        self._recorder.__enter__()

    def end(self) -> None:
        """Stop recording (called before capture_end) and keep the culprit, if an operation raised."""
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            return
        recorder.__exit__(None, None, None)
        if self.culprit is None:
            self.culprit = culprit_of(recorder.failed)
        self.captures.append(tuple(recorder.observations))

    @property
    def last_capture(self) -> tuple[Observation, ...]:
        """Everything recorded during the latest capture (empty before the first)."""
        return self.captures[-1] if self.captures else ()

    @contextmanager
    def during_captures(self) -> Iterator[CulpritHunt]:
        """Within this block, every CUDAGraph capture runs under set_sync_debug_mode("error") and
        the Recorder."""
        import torch

        cls: Any = torch.cuda.CUDAGraph
        orig_begin, orig_end = cls.capture_begin, cls.capture_end
        hunt = self

        def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig_begin(graph, *args, **kwargs)
            torch.cuda.set_sync_debug_mode("error")
            hunt.begin()
            return result

        def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
            hunt.end()
            torch.cuda.set_sync_debug_mode("default")
            return orig_end(graph, *args, **kwargs)

        cls.capture_begin, cls.capture_end = capture_begin, capture_end
        try:
            yield self
        finally:
            self.end()
            cls.capture_begin, cls.capture_end = orig_begin, orig_end
            torch.cuda.set_sync_debug_mode("default")

    def found(self, message: str) -> Observation | None:
        """The culprit: the classified operation that raised; else, when the error text `message`
        does not name a rule by itself (a bare 900/901), the first unsafe operation of the capture; else
        the first operation recorded under the rule the text names, in the failing capture or, failing that,
        the latest earlier capture that has one. A legacy-stream 906 raised at capture_end names no operation;
        the recording does. Megatron's local graphs capture each layer's forward and backward apart, so the
        forward's work on the legacy stream can run outside its graph unnoticed and fail only the backward
        capture that depends on it (the operation then lies in an earlier capture than the failing one)."""
        if self.culprit is not None:
            return self.culprit
        named = rule_of_text(message)
        if named is not None:
            return next((o for capture in reversed(self.captures) for o in capture if o.code == named), None)
        return culprit_of(self.last_capture)


def root_exception(exc: BaseException) -> BaseException:
    """The oldest exception in the chain that names a recognised capture problem, else `exc`."""
    for candidate in reversed(exception_chain(exc)):
        if match_known(str(candidate)) is not None:
            return candidate
    return exc


__all__ = ["CulpritHunt", "root_exception"]
