"""Capture-state queries in the user's code: GD519, `torch.cuda.is_current_stream_capturing()` asked during a
capture (True there, False eagerly, so the graph holds the other branch)."""

from __future__ import annotations

from typing import Any

from graphdoctor.child.witness.core import Watcher
from graphdoctor.child.witness.frames import user_issuer
from graphdoctor.protocol.events import Hazard


class CaptureQueryWatcher(Watcher):
    """torch.cuda.is_current_stream_capturing() answering True to the user's code."""

    def install(self) -> None:
        import torch.cuda.graphs as graphs

        core = self.core
        watcher = self

        def make_query(original: Any) -> Any:
            def is_capturing() -> bool:
                result = bool(original())
                if result and core.depth and not core.inside:
                    watcher._on_capture_query()
                return result
            return is_capturing

        core.patch(graphs, "_cuda_isCurrentStreamCapturing", make_query)

    def _on_capture_query(self) -> None:
        core = self.core

        def handle() -> None:
            location = user_issuer(2)
            if location is None:
                return
            module = core.module(2)
            core.add(Hazard(rule="GD519", module=module or "", location=location, step=core.step, phase="capture",
                            subject="torch.cuda.is_current_stream_capturing", message=(
                                f"{module or 'the code'} asks torch.cuda.is_current_stream_capturing() at "
                                f"{location}: True while the graph is captured (step {core.step}), False in eager "
                                "runs, so the graph holds the other branch and every replay runs it")))
        core.guarded(handle)


__all__ = ["CaptureQueryWatcher"]
