"""Result records of launch accounting: LaunchCount, LaunchTable, TraceAccounting, and the API
name classification they are built on. Pure data, no torch import.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from graphdoctor.errors import UsageError

SCHEMA_VERSION = 1
PHASES = ("eager", "warmup", "capture", "replay")
KERNEL_LAUNCH_APIS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
    }
)
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
_VERSION_SUFFIX = re.compile(r"_v\d+$")


def classify_host_call(name: str) -> str | None:
    """Return "kernel", "graph", "memcpy", "memset" or None for a runtime/driver API name.

    Args:
        name: The event name, e.g. `cudaLaunchKernel` or `cuMemcpyHtoDAsync_v2`.

    Returns:
        The launch kind, or None for calls that launch nothing (e.g. `cudaStreamIsCapturing`).
    """
    base = _VERSION_SUFFIX.sub("", name)
    if base in KERNEL_LAUNCH_APIS:
        return "kernel"
    if base in GRAPH_LAUNCH_APIS:
        return "graph"
    if base.startswith(("cudaMemcpy", "cuMemcpy")):
        return "memcpy"
    if base.startswith(("cudaMemset", "cuMemset")):
        return "memset"
    return None


@dataclass(frozen=True, slots=True)
class LaunchCount:
    """Launch figures for one slice of a trace (whole trace, one profiled step, or one phase).

    Host counts are API calls seen on the CPU; GPU counts are activities CUPTI recorded, joined to
    their launching call by `args.correlation`. Times are microseconds, as in the trace.
    """

    label: str
    """"total", "ProfilerStep#N", or the phase annotation "graphdoctor/<impl>/<phase>/<step>"."""
    impl: str | None = None
    """Implementation name from the phase annotation (None for total/step slices)."""
    phase: str | None = None
    """One of PHASES for phase slices, else None."""
    step: str | None = None
    """Step index from the phase annotation, or the ProfilerStep number."""
    num_steps: int = 1
    """How many annotated ranges were merged into this record."""
    host_time_us: float = 0.0
    """Wall time of the annotated range(s) on the CPU."""
    launch_calls: dict[str, int] = field(default_factory=dict)
    """Host launch calls per API name (kernel, graph, memcpy and memset APIs only)."""
    num_kernel_launches: int = 0
    """Host kernel-launch API calls, RNG prologue fills included."""
    num_graph_launches: int = 0
    """`cudaGraphLaunch` calls."""
    num_memcpy_calls: int = 0
    """Host memcpy API calls."""
    num_memset_calls: int = 0
    """Host memset API calls."""
    num_prologue_fill_launches: int = 0
    """Kernel launches identified as `CUDAGraph.replay()` RNG prologue fills (subset of kernels)."""
    num_gpu_kernels_eager: int = 0
    """GPU kernels launched outside graphs, prologue fills excluded."""
    num_gpu_kernels_prologue: int = 0
    """GPU kernels of the RNG prologue fills."""
    num_gpu_kernels_in_graph: int = 0
    """GPU kernels whose launching call was a graph launch."""
    num_gpu_memops_eager: int = 0
    """GPU memcpy/memset activities launched outside graphs."""
    num_gpu_memops_in_graph: int = 0
    """GPU memcpy/memset activities executed by graph launches."""
    num_gpu_kernels_unattributed: int = 0
    """GPU kernels whose correlation id matched no launch call in the trace (total slice only)."""
    kernels_per_graph_launch: tuple[int, ...] = ()
    """GPU kernel count of each graph launch, in launch order."""
    gpu_kernel_time_eager_us: float = 0.0
    """Summed duration of eager kernels (prologue fills excluded)."""
    gpu_kernel_time_prologue_us: float = 0.0
    """Summed duration of prologue fill kernels."""
    gpu_kernel_time_in_graph_us: float = 0.0
    """Summed duration of kernels run inside graphs."""

    @property
    def num_host_launches(self) -> int:
        """All host launch calls: kernels + graphs + memcpy + memset."""
        return (
            self.num_kernel_launches
            + self.num_graph_launches
            + self.num_memcpy_calls
            + self.num_memset_calls
        )

    @property
    def num_gpu_kernels(self) -> int:
        """All GPU kernels: eager + prologue + in graph (+ unattributed)."""
        return (
            self.num_gpu_kernels_eager
            + self.num_gpu_kernels_prologue
            + self.num_gpu_kernels_in_graph
            + self.num_gpu_kernels_unattributed
        )

    @property
    def graph_coverage(self) -> float:
        """Share of attributed GPU kernel time spent inside graphs (0.0 when there is none)."""
        total = (
            self.gpu_kernel_time_eager_us
            + self.gpu_kernel_time_prologue_us
            + self.gpu_kernel_time_in_graph_us
        )
        return self.gpu_kernel_time_in_graph_us / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: every field plus the derived totals and coverage."""
        out: dict[str, Any] = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["launch_calls"] = dict(sorted(self.launch_calls.items()))
        out["kernels_per_graph_launch"] = list(self.kernels_per_graph_launch)
        out["num_host_launches"] = self.num_host_launches
        out["num_gpu_kernels"] = self.num_gpu_kernels
        out["graph_coverage"] = round(self.graph_coverage, 6)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchCount:
        """Inverse of to_dict (derived totals and coverage are recomputed, not read)."""
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        values["launch_calls"] = {str(k): int(v) for k, v in values.get("launch_calls", {}).items()}
        values["kernels_per_graph_launch"] = tuple(int(n) for n in values.get("kernels_per_graph_launch", ()))
        return cls(**values)


def merge_counts(counts: Sequence[LaunchCount], *, label: str) -> LaunchCount:
    """Sum several LaunchCount records (e.g. one phase over several steps) into one.

    Args:
        counts: Records to merge; must not be empty.
        label: Label of the merged record.

    Returns:
        A LaunchCount whose counts and times are sums; impl/phase kept when all records agree.

    Raises:
        UsageError: counts is empty.
    """
    if not counts:
        raise UsageError("merge_counts: got no records, expected at least one LaunchCount")
    calls: dict[str, int] = defaultdict(int)
    for count in counts:
        for name, num in count.launch_calls.items():
            calls[name] += num
    impls = {c.impl for c in counts}
    phases = {c.phase for c in counts}
    summed = {
        name: sum(getattr(c, name) for c in counts)
        for name in LaunchCount.__dataclass_fields__
        if name.startswith(("num_", "host_time", "gpu_kernel_time"))
    }
    return LaunchCount(
        label=label,
        impl=impls.pop() if len(impls) == 1 else None,
        phase=phases.pop() if len(phases) == 1 else None,
        step=None,
        launch_calls=dict(calls),
        kernels_per_graph_launch=tuple(k for c in counts for k in c.kernels_per_graph_launch),
        **summed,
    )


@dataclass(frozen=True, slots=True)
class LaunchTable:
    """Eager vs graphed launch figures of one implementation (phases merged over steps)."""

    impl: str
    """Implementation name from the phase annotations."""
    eager: LaunchCount | None
    """Merged `eager` phases, or None when the trace has none."""
    graphed: LaunchCount | None
    """Merged `replay` phases (steady-state graphed steps), or None."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with both columns (None when absent)."""
        return {
            "impl": self.impl,
            "eager": self.eager.to_dict() if self.eager else None,
            "graphed": self.graphed.to_dict() if self.graphed else None,
        }


@dataclass(frozen=True, slots=True)
class TraceAccounting:
    """Everything `graphdoctor count` reports for one trace."""

    source: str
    """Trace path."""
    num_events: int
    """Events in the trace, all categories."""
    total: LaunchCount
    """The whole trace."""
    steps: tuple[LaunchCount, ...]
    """One record per `ProfilerStep#N` range (empty when the trace has none)."""
    phases: tuple[LaunchCount, ...]
    """One record per `graphdoctor/<impl>/<phase>/<step>` range, in time order."""
    tables: tuple[LaunchTable, ...]
    """Eager vs graphed per implementation (empty without phase annotations)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON document with `"schema_version": 1` (documented in docs/launches.md)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "num_events": self.num_events,
            "total": self.total.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "phases": [p.to_dict() for p in self.phases],
            "tables": [t.to_dict() for t in self.tables],
        }

    def phase(self, impl: str, phase: str) -> LaunchCount | None:
        """Merge of all steps of one (impl, phase), or None when absent."""
        found = [p for p in self.phases if p.impl == impl and p.phase == phase]
        return merge_counts(found, label=f"{impl}/{phase}") if found else None


__all__ = [
    "GRAPH_LAUNCH_APIS",
    "KERNEL_LAUNCH_APIS",
    "PHASES",
    "SCHEMA_VERSION",
    "LaunchCount",
    "LaunchTable",
    "TraceAccounting",
    "classify_host_call",
    "merge_counts",
]
