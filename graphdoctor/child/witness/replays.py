"""Graphs captured with grad on replayed with grad off (evaluation replaying the training graph): GD402 when
Megatron's code replays it, GD514 when the user's does, placed at the user's mode-dependent line."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from graphdoctor.child.taps import graph_method_owner
from graphdoctor.child.witness.core import Watcher, WitnessCore
from graphdoctor.child.witness.frames import innermost_outside_torch, user_issuer
from graphdoctor.child.witness.source import mode_query_lines
from graphdoctor.protocol.events import Hazard


class EvalReplayWatcher(Watcher):
    """Replays of a training graph with grad off (a patched CUDAGraph.replay)."""

    def __init__(self, core: WitnessCore) -> None:
        super().__init__(core)
        self._replayed_off: set[int] = set()

    def install(self) -> None:
        core = self.core
        watcher = self

        def make_replay(original: Any) -> Any:
            def replay(graph: Any, *args: Any, **kwargs: Any) -> Any:
                if not torch.is_grad_enabled() and core.grad_at_capture.get(id(graph)) is True:
                    watcher._on_replay_without_grad(graph)
                return original(graph, *args, **kwargs)
            return replay

        core.patch(graph_method_owner("capture_begin", "capture_end", "replay"), "replay", make_replay)

    def settle(self) -> None:
        """Training graphs replayed with grad off: one hazard per rule, pointing at the user's mode-dependent
        line (what evaluation should have run differently) with every replay site beside it."""
        found = self.core.found
        for rule in ("GD402", "GD514"):
            keys = [k for k, h in found.items() if h.rule == rule]
            if not keys:
                continue
            first = found[keys[0]]
            sites = tuple(dict.fromkeys(loc for k in keys if (loc := found[k].location)))
            for key in keys:
                del found[key]
            hazard = dataclasses.replace(first, also_at=sites)
            for module_id, module in self.core.modules.items():
                lines = mode_query_lines(type(module))
                if lines:
                    name = self.core.names.get(module_id, type(module).__name__)
                    hazard = dataclasses.replace(
                        hazard, module=name, location=lines[0], also_at=sites + tuple(lines[1:]),
                        message=hazard.message + f"; {name}.forward branches on the mode at {lines[0]}")
                    break
            found[(rule, hazard.module, hazard.location or "")] = hazard

    def _on_replay_without_grad(self, graph: Any) -> None:
        core = self.core

        def handle() -> None:
            if id(graph) in self._replayed_off:
                return
            self._replayed_off.add(id(graph))
            module = core.module(2)
            location = innermost_outside_torch(2)
            library = user_issuer(2) is None
            rule = "GD402" if library else "GD514"
            who = "Megatron's graph runner" if library else "the user's code"
            core.add(Hazard(rule=rule, module=module or "", location=location, step=core.step, subject="replay",
                            phase="eval",
                            message=(f"a graph captured with grad on (training) was replayed with grad off "
                                     f"(evaluation) by {who} at {location}: evaluation runs what the training "
                                     "capture recorded, training-mode branches included")))
        core.guarded(handle)


__all__ = ["EvalReplayWatcher"]
