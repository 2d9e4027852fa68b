"""Step observers a child attaches to its training loop: phase ranges, memory, launches, hazards.

Each observer sees begin_step/end_step with the step's phase and returns its events from finish()
(a Memory, Launches or Hazard event of graphdoctor.protocol). An observer that fails records its
error in its section; it never ends the training run.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from graphdoctor.child.hazards import NoneMaskObserver
from graphdoctor.child.holders import HolderWatcher
from graphdoctor.child.witness import CaptureWitness
from graphdoctor.config.impl import Impl
from graphdoctor.launches.census import GraphCensus
from graphdoctor.launches.compare import LaunchSection
from graphdoctor.memory.sections import MemorySection, MemoryStats
from graphdoctor.protocol.events import Event, Launches, Memory
from graphdoctor.protocol.spec import ChildSpec, Role


class Observer(Protocol):
    """What the loop calls on an observer (subclasses get these do-nothing defaults)."""

    def begin_step(self, step: int, phase: str) -> None:
        """Called before a step's forward_backward."""

    def end_step(self, step: int, phase: str) -> None:
        """Called after a step's optimizer step."""

    def finish(self) -> list[Event]:
        """The events this observer reports at the end of the run."""
        return []


def _error(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] or []
    where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
    return f"{type(exc).__name__}: {exc}"[:500] + where


class PhaseObserver(Observer):
    """NVTX range (domain `graphdoctor`) mirrored as record_function, one per step and phase."""

    def __init__(self, impl: str) -> None:
        self.impl = impl
        self._open: Any = None

    def begin_step(self, step: int, phase: str) -> None:
        from graphdoctor.launches.phases import phase as phase_range

        self._open = phase_range(self.impl, phase, step)
        self._open.__enter__()

    def end_step(self, step: int, phase: str) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None


HISTORY_REPLAY_STEPS = 2
"""Replay steps recorded with allocator history (enough to see a per-step leak at two steps); the
history then stops so later, timed steps run without its per-allocation cost."""


class MemoryObserver(Observer):
    """Allocator history tagged `<phase>:<step>`; snapshots before capture, after capture and after
    the first replays; allocated bytes after every replay step; analysed in the child so only the
    figures travel back."""

    def __init__(self, spec: ChildSpec) -> None:
        from graphdoctor.memory import recorder

        self.spec = spec
        self.recorder = recorder
        self.graphed = spec.graphed
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.num_replay_steps = 0
        self.replay_live_bytes: list[int] = []
        self.failure: str | None = None
        recorder.reset_peaks()
        if self.graphed:
            recorder.start_history()

    def begin_step(self, step: int, phase: str) -> None:
        if not self.graphed or self.failure:
            return
        try:
            if phase == "capture" and "before_capture" not in self.snapshots:
                self.snapshots["before_capture"] = self.recorder.take_snapshot()
            self.recorder.set_phase(f"{phase}:{step}")
        except Exception as exc:  # noqa: BLE001 - recorded in the report, run goes on
            self.failure = _error(exc)

    def end_step(self, step: int, phase: str) -> None:
        if not self.graphed or self.failure:
            return
        try:
            if phase == "capture":
                self.snapshots["after_capture"] = self.recorder.take_snapshot()
            elif phase == "replay":
                import torch

                self.num_replay_steps += 1
                torch.cuda.synchronize()
                self.replay_live_bytes.append(int(torch.cuda.memory_allocated()))
                if self.num_replay_steps == HISTORY_REPLAY_STEPS:
                    self.snapshots["after_replays"] = self.recorder.take_snapshot()
                    self.recorder.stop_history()
        except Exception as exc:  # noqa: BLE001 - recorded in the report, run goes on
            self.failure = _error(exc)

    def finish(self) -> list[Event]:
        stats = MemoryStats.from_dict(self.recorder.pool_bytes_from_stats())
        if not self.graphed or self.failure:
            return [Memory(section=MemorySection(stats=stats, error=self.failure))]
        try:
            after = self.snapshots.pop("after_replays", None)
            if after is None:
                after = self.recorder.take_snapshot()
                self.recorder.stop_history()
            section = self._analyze(after, stats)
        except Exception as exc:  # noqa: BLE001 - recorded in the report
            section = MemorySection(stats=stats, error=_error(exc))
        return [Memory(section=section)]

    def _analyze(self, after: dict[str, Any], stats: MemoryStats) -> MemorySection:
        from graphdoctor.memory.leaks import analyze_run

        # The eager reference's peaks are filled in by the parent (MemorySection.against_eager):
        # children may run at the same time.
        report = analyze_run(
            self.snapshots["before_capture"], self.snapshots["after_capture"], after,
            num_replay_steps=max(1, min(self.num_replay_steps, HISTORY_REPLAY_STEPS)),
            eager_peak_allocated_bytes=None, eager_peak_reserved_bytes=None,
            peak_allocated_bytes=stats.peak_allocated_bytes,
            peak_reserved_bytes=stats.peak_reserved_bytes,
            replay_live_bytes=self.replay_live_bytes)
        snapshot_reserved = sum(int(s["total_size"]) for s in after.get("segments", []))
        stats_reserved = stats.reserved_bytes
        if self.spec.keep_snapshots and self.spec.config.snapshot_dir:
            self._dump(after)
        return MemorySection(
            stats=stats, report=report, snapshot_reserved_bytes=snapshot_reserved,
            stats_reserved_bytes=stats_reserved,
            snapshot_vs_stats_pct=(round(100.0 * abs(snapshot_reserved - stats_reserved) / stats_reserved, 4)
                                   if stats_reserved else None))

    def _dump(self, after: dict[str, Any]) -> None:
        import gzip
        import pickle

        base = Path(str(self.spec.config.snapshot_dir))
        for name, snap in (*self.snapshots.items(), ("after_replays", after)):
            path = base / f"snapshot-{self.spec.name}-{name}.pickle.gz"
            with gzip.open(path, "wb") as fh:
                pickle.dump(snap, fh, protocol=4)


class LaunchObserver(Observer):
    """Profiles the last step with torch.profiler; accounts launches on the exported trace; takes a
    census of the graphs Megatron holds (captured under keep_graphs)."""

    def __init__(self, spec: ChildSpec, model: Any) -> None:
        from graphdoctor.launches.kept import keep_graphs
        from graphdoctor.launches.profile import prepare_profiler_for_graphs

        self.spec = spec
        self.model = model
        # One extra step after the compared ones is profiled: the profile holds a pure training
        # step, without graphdoctor's comparison work.
        self.last_step = spec.config.steps
        self.profiler: Any = None
        self.failure: str | None = None
        self.trace_path = Path(spec.artifacts_dir or ".") / f"trace-{spec.name}.json.gz"
        prepare_profiler_for_graphs()
        self._keep = keep_graphs() if spec.graphed else None
        self._kept: Any = None
        if self._keep is not None:
            self._kept = self._keep.__enter__()

    def begin_step(self, step: int, phase: str) -> None:
        if step != self.last_step or self.failure:
            return
        import torch

        try:
            torch.cuda.synchronize()
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            self.profiler = torch.profiler.profile(activities=acts)
            self.profiler.__enter__()
        except Exception as exc:  # noqa: BLE001 - recorded in the report, run goes on
            self.failure = _error(exc)

    def end_step(self, step: int, phase: str) -> None:
        if step != self.last_step or self.profiler is None:
            return
        import torch

        try:
            torch.cuda.synchronize()
            self.profiler.__exit__(None, None, None)
            self.profiler.export_chrome_trace(str(self.trace_path))
        except Exception as exc:  # noqa: BLE001 - recorded in the report, run goes on
            self.failure = _error(exc)
        finally:
            self.profiler = None

    def finish(self) -> list[Event]:
        if self._keep is not None:
            self._keep.__exit__(None, None, None)
        if self.failure:
            return [Launches(section=LaunchSection(profiled_step=self.last_step, error=self.failure))]
        try:
            step = _account(self.trace_path, self.spec.impl)
        except Exception as exc:  # noqa: BLE001 - recorded in the report
            return [Launches(section=LaunchSection(profiled_step=self.last_step, trace=str(self.trace_path),
                                                   error=_error(exc)))]
        census, census_error = None, None
        if self.spec.graphed:
            try:
                census = (_census_kept(self._kept) if self.spec.impl == Impl.TRANSFORMER_ENGINE
                          else _census(self.model))
            except Exception as exc:  # noqa: BLE001 - recorded in the report
                census_error = _error(exc)
        return [Launches(section=LaunchSection(profiled_step=self.last_step, trace=str(self.trace_path),
                                               step=step, census=census, census_error=census_error))]


def _account(path: Path, impl: str) -> Any:
    from graphdoctor.launches.accounting import account_trace

    accounting = account_trace(path)
    steps = [p for p in accounting.phases if p.impl == impl]
    return steps[-1] if steps else accounting.total


def _census(model: Any) -> tuple[GraphCensus, ...]:
    from graphdoctor.launches.kept import census_megatron

    return tuple(census for _, census in census_megatron(model).items())


def _census_kept(kept: Any) -> tuple[GraphCensus, ...]:
    """Census of every graph created during the run (Transformer Engine keeps its graphs inside
    the graphed callables it returns, one forward and one backward graph per layer and micro-batch)."""
    from graphdoctor.launches.census import CensusError, census_graph

    result: list[GraphCensus] = []
    for i, graph in enumerate(kept.graphs if kept is not None else []):
        try:
            result.append(census_graph(graph, name=f"transformer_engine/graph{i}"))
        except CensusError as exc:
            # On the H200 (TE 2.20.2) a kept CUDAGraph raised "cannot access the raw
            # cudaGraph_t until capture_end()": a graph object that was never captured. Only
            # captured graphs are replayed, so only they belong in the census.
            if "capture_end" not in str(exc):
                raise
    return tuple(result)


class Timed(Observer):
    """An observer with its own seconds counted: attaching it, its step hooks and its finish, and the seconds
    it spends inside the training step (an observer's `inline_s`: work in patched functions, like the holder
    watch's). `step_s` is what the loop's training seconds leave out: the step hooks and the inline seconds."""

    def __init__(self, name: str, make: Callable[[], Observer]) -> None:
        self.name = name
        began = time.perf_counter()
        self.inner = make()
        self._own_s = time.perf_counter() - began
        self._hooks_s = 0.0

    @property
    def _inline_s(self) -> float:
        return float(getattr(self.inner, "inline_s", 0.0))

    @property
    def seconds(self) -> float:
        """All the observer's seconds."""
        return self._own_s + self._hooks_s + self._inline_s

    @property
    def hooks_s(self) -> float:
        """Its step hooks' seconds (what recurs every step)."""
        return self._hooks_s

    @property
    def watched(self) -> dict[str, int]:
        """What the observer watches every step, counted by kind, where it says (an empty dict elsewhere)."""
        return dict(getattr(self.inner, "watched", None) or {})

    @property
    def step_s(self) -> float:
        """Its seconds inside the training loop."""
        return self._hooks_s + self._inline_s

    def begin_step(self, step: int, phase: str) -> None:
        self._step_hook(self.inner.begin_step, step, phase)

    def end_step(self, step: int, phase: str) -> None:
        self._step_hook(self.inner.end_step, step, phase)

    def finish(self) -> list[Event]:
        began = time.perf_counter()
        try:
            return self.inner.finish()
        finally:
            self._own_s += time.perf_counter() - began

    def _step_hook(self, hook: Callable[[int, str], None], step: int, phase: str) -> None:
        began = time.perf_counter()
        try:
            hook(step, phase)
        finally:
            self._hooks_s += time.perf_counter() - began


def make_observers(spec: ChildSpec, model: Any, names: dict[int, str] | None = None, *,
                   setup: Any = None) -> tuple[Timed, ...]:
    """Observers this child needs, from its spec (tapped runs get none), each with its seconds counted
    under its name (graphdoctor.protocol.seconds.OBSERVER_NAMES); the holder watch needs the Megatron `setup`
    (optimizer, config, forward_step)."""
    if spec.role is Role.TAPPED:
        return ()
    observers: list[Timed] = []
    if spec.config.launches:
        observers.append(Timed("launches", lambda: LaunchObserver(spec, model)))
    observers.append(Timed("phases", lambda: PhaseObserver(spec.impl)))
    if spec.config.memory and spec.role is not Role.COUNT:
        observers.append(Timed("memory", lambda: MemoryObserver(spec)))
    if spec.impl == Impl.TRANSFORMER_ENGINE and names is not None:
        observers.append(Timed("none_mask", lambda: NoneMaskObserver(model, names)))
    if spec.graphed and spec.role is Role.GRAPHED and names is not None:
        observers.append(Timed("witness", lambda: CaptureWitness(model, names)))
        if setup is not None and spec.holders:
            watched = names
            observers.append(Timed("holders", lambda: HolderWatcher(setup, watched, spec.impl)))
    return tuple(observers)


__all__ = ["LaunchObserver", "MemoryObserver", "Observer", "PhaseObserver", "Timed", "make_observers"]
