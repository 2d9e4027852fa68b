"""Typed views of the sections of a saved diff report (steps, diagnosis, memory, launches).

Parsed from the JSON payload (docs/diff.md, schema_version 1 and 2): missing fields become None, unknown
fields are ignored, and the strings "nan"/"inf"/"-inf" read back as floats. html_model assembles them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EAGER_NAMES = frozenset({"none", "eager"})
"""Spellings of the eager reference's `impl`."""

PASSING_VERDICTS = frozenset({"match", "rng-divergence", "unavailable"})


def num(value: Any) -> float | None:
    """A JSON number, or the strings "nan"/"inf"/"-inf" the writer uses for non-finite values."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def as_int(value: Any) -> int | None:
    """A finite JSON number as int, else None."""
    number = num(value)
    return int(number) if number is not None and math.isfinite(number) else None


def as_str(value: Any) -> str | None:
    """str(value), None kept."""
    return None if value is None else str(value)


def as_map(value: Any) -> Mapping[str, Any]:
    """value when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    """value as a list when it is a JSON array, else empty."""
    return list(value) if isinstance(value, (list, tuple)) else []


@dataclass(frozen=True, slots=True)
class TensorDiffView:
    """Per-step comparison of one tensor family (main_grads or params)."""

    num_tensors: int
    num_unequal: int
    max_abs: float | None
    max_rel: float | None
    """Largest differences over the family; None where unequal tensors were not measured."""

    first_tensor: str | None
    measured: bool = True
    """False where only bit fingerprints were compared (schema 2 `measured: false`)."""

    @classmethod
    def parse(cls, raw: Any) -> TensorDiffView | None:
        """None when the step was not compared.

        Fingerprints only (measured false): equal fingerprints are bitwise equal tensors, so every
        magnitude is 0 when no tensor differs; where some differ, their magnitudes are unknown (None).
        """
        if not isinstance(raw, Mapping):
            return None
        measured = raw.get("measured", True) is not False
        num_unequal = as_int(raw.get("num_unequal")) or 0
        max_abs, max_rel = num(raw.get("max_abs")), num(raw.get("max_rel"))
        if not measured:
            max_abs = max_rel = 0.0 if num_unequal == 0 else None
        return cls(as_int(raw.get("num_tensors")) or 0, num_unequal, max_abs, max_rel,
                   as_str(raw.get("first_tensor")), measured)


@dataclass(frozen=True, slots=True)
class StepView:
    """One training step of one run."""

    step: int
    phase: str
    loss: float | None
    step_time_ms: float | None
    profiled: bool
    grads: TensorDiffView | None
    params: TensorDiffView | None

    @classmethod
    def parse(cls, raw: Mapping[str, Any], index: int) -> StepView:
        """A step; a missing step number falls back to the row index."""
        step = as_int(raw.get("step"))
        return cls(index if step is None else step, str(raw.get("phase") or ""), num(raw.get("loss")),
                   num(raw.get("step_time_ms")), bool(raw.get("profiled")),
                   TensorDiffView.parse(raw.get("grads")), TensorDiffView.parse(raw.get("params")))


@dataclass(frozen=True, slots=True)
class EvalView:
    """One evaluation of one run (the run schedule's eval phase)."""

    index: int
    after_step: int
    final: bool
    loss: float | None

    @classmethod
    def parse(cls, raw: Mapping[str, Any], index: int) -> EvalView:
        """An evaluation; a missing index falls back to the row index."""
        given = as_int(raw.get("index"))
        after = as_int(raw.get("after_step"))
        return cls(index if given is None else given, -1 if after is None else after, bool(raw.get("final")),
                   num(raw.get("loss")))


@dataclass(frozen=True, slots=True)
class RunView:
    """One child run (eager reference, graphed run, control run, re-run)."""

    impl: str
    dropout: float | None
    status: str
    steps: tuple[StepView, ...]
    diagnosis: DiagnosisView | None = None
    """Why the run failed, when it did."""
    evals: tuple[EvalView, ...] = ()
    """Evaluations between and after the training steps (reports before the run schedule have none)."""

    @property
    def is_eager(self) -> bool:
        """True for the eager reference ("none" or "eager")."""
        return self.impl in EAGER_NAMES

    @property
    def compared_steps(self) -> tuple[StepView, ...]:
        """Steps that were compared against eager (the profiled extra step is left out)."""
        return tuple(s for s in self.steps if not s.profiled)

    @classmethod
    def parse(cls, raw: Any) -> RunView | None:
        """None when the run is absent."""
        if not isinstance(raw, Mapping):
            return None
        steps = tuple(StepView.parse(s, i) for i, s in enumerate(as_list(raw.get("steps")))
                      if isinstance(s, Mapping))
        evals = tuple(EvalView.parse(e, i) for i, e in enumerate(as_list(raw.get("evals")))
                      if isinstance(e, Mapping))
        return cls(str(raw.get("impl") or "none"), num(raw.get("dropout")), str(raw.get("status") or "?"),
                   steps, DiagnosisView.parse(raw.get("diagnosis")), evals)


@dataclass(frozen=True, slots=True)
class DiagnosisView:
    """Why a run failed or differs: error, rule, module, file:line and the fix."""

    error_type: str | None
    message: str | None
    cuda_error: str | None
    meaning: str | None
    fix: str | None
    rule: str | None
    module: str | None
    location: str | None
    step: int | None
    phase: str | None
    reported_as: str | None
    also_at: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: Any) -> DiagnosisView | None:
        """None when there is no diagnosis."""
        if not isinstance(raw, Mapping):
            return None
        get = raw.get
        return cls(as_str(get("error_type")), as_str(get("message")), as_str(get("cuda_error")), as_str(get("meaning")),
                   as_str(get("fix")), as_str(get("rule")), as_str(get("module")), as_str(get("location")),
                   as_int(get("step")), as_str(get("phase")), as_str(get("reported_as")),
                   tuple(str(a) for a in as_list(get("also_at"))))


@dataclass(frozen=True, slots=True)
class CauseView:
    """One rule the graphed run's evidence names (`impls[].causes`)."""

    rule: str
    name: str
    severity: str
    module: str
    location: str | None
    message: str
    fix: str
    explains: bool
    also_at: tuple[str, ...] = ()
    """Other lines of the same evidence (the sites that rebind, replay or set the value)."""

    @classmethod
    def parse(cls, raw: Any) -> CauseView | None:
        """None when the entry is not an object."""
        if not isinstance(raw, Mapping):
            return None
        get = raw.get
        return cls(as_str(get("rule")) or "?", as_str(get("name")) or "", as_str(get("severity")) or "",
                   as_str(get("module")) or "", as_str(get("location")), as_str(get("message")) or "",
                   as_str(get("fix")) or "", get("explains") is True,
                   tuple(str(a) for a in as_list(get("also_at"))))


@dataclass(frozen=True, slots=True)
class DivergenceView:
    """The first step and tensor where a graphed run differs from eager."""

    step: int | None
    what: str
    tensor: str | None
    max_abs: float | None
    max_rel: float | None
    loss_max_abs: float | None
    key: str | None = None
    """The first differing reported value's key (schema 2 reports since reported values)."""

    @classmethod
    def parse(cls, raw: Any) -> DivergenceView | None:
        """None when nothing differs."""
        if not isinstance(raw, Mapping):
            return None
        return cls(as_int(raw.get("step")), str(raw.get("what") or "?"), as_str(raw.get("tensor")),
                   num(raw.get("max_abs")), num(raw.get("max_rel")), num(raw.get("loss_max_abs")),
                   as_str(raw.get("key")))


@dataclass(frozen=True, slots=True)
class TimingView:
    """Steady-state step time eager against graphed."""

    eager_ms: float | None
    graphed_ms: float | None
    speedup: float | None

    @classmethod
    def parse(cls, raw: Any) -> TimingView | None:
        """None when the run was not timed."""
        if not isinstance(raw, Mapping):
            return None
        return cls(num(raw.get("eager_ms")), num(raw.get("graphed_ms")), num(raw.get("speedup")))


@dataclass(frozen=True, slots=True)
class ControlView:
    """The dropout-free control pair's result."""

    dropout: float | None
    verdict: str
    first_divergence: DivergenceView | None
    diagnosis: DiagnosisView | None

    @classmethod
    def parse(cls, raw: Any) -> ControlView | None:
        """None when no control pair ran."""
        if not isinstance(raw, Mapping):
            return None
        return cls(num(raw.get("dropout")), str(raw.get("verdict") or "?"),
                   DivergenceView.parse(raw.get("first_divergence")), DiagnosisView.parse(raw.get("diagnosis")))


@dataclass(frozen=True, slots=True)
class PoolView:
    """One CUDA graph private memory pool."""

    pool: str
    reserved_bytes: int
    live_bytes: int


@dataclass(frozen=True, slots=True)
class LeakSiteView:
    """An allocation site whose replay-time allocations stay alive."""

    site: str
    num_allocations: int
    live_bytes: int
    num_steps: int
    is_suspect: bool
    frames: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MemoryView:
    """Memory of one graphed run against the eager reference (docs/memory.md)."""

    verdict: str
    summary: str
    graph_pool_reserved_bytes: int | None
    graph_pools: tuple[PoolView, ...]
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    eager_peak_allocated_bytes: int | None
    eager_peak_reserved_bytes: int | None
    peak_reserved_over_eager: float | None
    live_bytes_before_capture: int | None
    live_bytes_after_capture: int | None
    live_bytes_after_replays: int | None
    reserved_bytes_after_replays: int | None
    bytes_gained_per_replay_step: float | None
    num_replay_steps: int | None
    leak_sites: tuple[LeakSiteView, ...]
    notes: tuple[str, ...]

    @classmethod
    def parse(cls, raw: Any) -> MemoryView | None:
        """None when memory was not recorded."""
        if not isinstance(raw, Mapping):
            return None
        get = raw.get
        pools = tuple(PoolView(str(p.get("pool")), as_int(p.get("reserved_bytes")) or 0, as_int(p.get("live_bytes")) or 0)
                      for p in as_list(get("graph_pools")) if isinstance(p, Mapping))
        sites = tuple(LeakSiteView(str(s.get("site") or "?"), as_int(s.get("num_allocations")) or 0,
                                   as_int(s.get("live_bytes")) or 0, as_int(s.get("num_steps")) or 0,
                                   bool(s.get("is_suspect")), tuple(str(f) for f in as_list(s.get("frames"))))
                      for s in as_list(get("unfreed_replay_sites")) if isinstance(s, Mapping))
        return cls(str(get("verdict") or "?"), str(get("summary") or ""), as_int(get("graph_pool_reserved_bytes")),
                   pools, as_int(get("peak_allocated_bytes")), as_int(get("peak_reserved_bytes")),
                   as_int(get("eager_peak_allocated_bytes")), as_int(get("eager_peak_reserved_bytes")),
                   num(get("peak_reserved_over_eager")), as_int(get("live_bytes_before_capture")),
                   as_int(get("live_bytes_after_capture")), as_int(get("live_bytes_after_replays")),
                   as_int(get("reserved_bytes_after_replays")), num(get("bytes_gained_per_replay_step")),
                   as_int(get("num_replay_steps")), sites, tuple(str(n) for n in as_list(get("notes"))))


@dataclass(frozen=True, slots=True)
class LaunchStepView:
    """Launch accounting of one profiled step."""

    label: str
    host_time_us: float | None
    num_host_launches: int | None
    num_kernel_launches: int | None
    num_graph_launches: int | None
    num_memcpy_calls: int | None
    num_memset_calls: int | None
    num_prologue_fill_launches: int | None
    num_gpu_kernels_eager: int | None
    num_gpu_kernels_in_graph: int | None
    graph_coverage: float | None

    @classmethod
    def parse(cls, raw: Any) -> LaunchStepView | None:
        """None when the step was not profiled."""
        if not isinstance(raw, Mapping):
            return None
        get = raw.get
        return cls(str(get("label") or ""), num(get("host_time_us")), as_int(get("num_host_launches")),
                   as_int(get("num_kernel_launches")), as_int(get("num_graph_launches")), as_int(get("num_memcpy_calls")),
                   as_int(get("num_memset_calls")), as_int(get("num_prologue_fill_launches")),
                   as_int(get("num_gpu_kernels_eager")), as_int(get("num_gpu_kernels_in_graph")),
                   num(get("graph_coverage")))


@dataclass(frozen=True, slots=True)
class GraphCensusView:
    """Node counts of one captured graph."""

    name: str
    num_nodes: int
    num_kernels: int
    nodes_by_type: tuple[tuple[str, int], ...]
    source: str


@dataclass(frozen=True, slots=True)
class LaunchesView:
    """Launches eager against graphed, and the census of the captured graphs."""

    eager: LaunchStepView | None
    graphed: LaunchStepView | None
    census: tuple[GraphCensusView, ...]
    census_match: bool | None
    summary: str

    @classmethod
    def parse(cls, raw: Any) -> LaunchesView | None:
        """None when launches were not profiled."""
        if not isinstance(raw, Mapping):
            return None
        census = tuple(
            GraphCensusView(str(name), as_int(g.get("num_nodes")) or 0, as_int(g.get("num_kernels")) or 0,
                            tuple((str(k), as_int(v) or 0) for k, v in as_map(g.get("nodes_by_type")).items()),
                            str(g.get("source") or ""))
            for name, g in as_map(raw.get("census")).items() if isinstance(g, Mapping))
        match = as_map(raw.get("census_check")).get("match")
        return cls(LaunchStepView.parse(raw.get("eager")), LaunchStepView.parse(raw.get("graphed")), census,
                   match if isinstance(match, bool) else None, str(raw.get("summary") or ""))


__all__ = [
    "as_int", "as_list", "as_map", "as_str", "num",
    "EAGER_NAMES", "PASSING_VERDICTS", "ControlView", "DiagnosisView", "DivergenceView", "EvalView",
    "GraphCensusView", "LaunchStepView", "LaunchesView", "LeakSiteView", "MemoryView",
    "PoolView", "RunView", "StepView", "TensorDiffView", "TimingView",
]
