"""The launch section of one child run and the eager-vs-graphed comparison of a diff row.

A child's LaunchObserver reports a LaunchSection (its profiled step, trace and graph census); the parent
puts the eager step beside each graphed one in a LaunchComparison and checks the census against the
profiler. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphdoctor.launches.census import GraphCensus
from graphdoctor.launches.counts import LaunchCount

TABLE_ROWS: tuple[tuple[str, str], ...] = (
    ("host launch calls", "num_host_launches"),
    ("  kernel launches (cudaLaunchKernel*/cuLaunchKernel*)", "num_kernel_launches"),
    ("  graph launches (cudaGraphLaunch)", "num_graph_launches"),
    ("  memcpy / memset calls", "_memops"),
    ("RNG prologue fills (replay(), outside graphs)", "num_prologue_fill_launches"),
    ("GPU kernels eager", "num_gpu_kernels_eager"),
    ("GPU kernels inside graphs", "num_gpu_kernels_in_graph"),
    ("graph coverage (kernel time in graphs)", "graph_coverage"),
    ("host time per step (us)", "host_time_us"),
)
"""Rows of the eager-vs-graphed launch table: (label, LaunchCount field)."""


@dataclass(frozen=True, slots=True)
class LaunchSection:
    """What the launch observer of one run found."""

    profiled_step: int | None = None
    """The step run under torch.profiler (one past the compared steps)."""
    trace: str | None = None
    """The Chrome trace of that step."""
    step: LaunchCount | None = None
    """Launch accounting of the profiled step."""
    census: tuple[GraphCensus, ...] | None = None
    """Node census of every graph the run holds (graphed runs)."""
    census_error: str | None = None
    """Why the census failed, when it did."""
    error: str | None = None
    """Why profiling or accounting failed, when it did (the run itself went on)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        out: dict[str, Any] = {"profiled_step": self.profiled_step, "trace": self.trace}
        if self.step is not None:
            out["step"] = self.step.to_dict()
        if self.census is not None:
            out["census"] = {c.name: c.to_dict() for c in self.census}
        elif self.census_error is not None:
            out["census"] = {"error": self.census_error}
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchSection:
        """Inverse of to_dict."""
        raw_census = data.get("census")
        census, census_error = None, None
        if isinstance(raw_census, dict) and "error" in raw_census:
            census_error = str(raw_census["error"])
        elif isinstance(raw_census, dict):
            census = tuple(GraphCensus.from_dict({**c, "name": c.get("name", name)})
                           for name, c in raw_census.items())
        step = data.get("step")
        return cls(profiled_step=data.get("profiled_step"), trace=data.get("trace"),
                   step=LaunchCount.from_dict(step) if step else None, census=census,
                   census_error=census_error, error=data.get("error"))


@dataclass(frozen=True, slots=True)
class CensusCheck:
    """Census kernel counts per graph against the profiler's kernels per graph launch.

    Each graph Megatron holds is launched once per training step, so the multiset of census kernel
    counts must equal the multiset of per-launch kernel counts of the profiled step.
    """

    census_kernels_per_graph: tuple[int, ...]
    profiler_kernels_per_launch: tuple[int, ...]

    @property
    def match(self) -> bool:
        """True when both multisets are equal and not empty."""
        return bool(self.census_kernels_per_graph) and (
            self.census_kernels_per_graph == self.profiler_kernels_per_launch)

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"census_kernels_per_graph": list(self.census_kernels_per_graph),
                "profiler_kernels_per_launch": list(self.profiler_kernels_per_launch),
                "match": self.match}


@dataclass(frozen=True, slots=True)
class LaunchComparison:
    """The `launches` field of one implementation: eager step beside the graphed step."""

    eager: LaunchCount | None
    graphed: LaunchCount | None
    trace: str | None = None
    census: tuple[GraphCensus, ...] | None = None
    census_check: CensusCheck | None = None
    census_error: str | None = None
    error: str | None = None
    tap_graph_nodes: int | None = None
    """Nodes graphdoctor's capture-time taps added to the graphed run's graphs, where that run carried taps
    (graphdoctor.config.DiffConfig.taps_in_first_runs): the census and the kernels inside graphs count them too."""

    @property
    def summary(self) -> str:
        """One line: host launches eager -> graphed, graph launches, coverage, census agreement."""
        if self.graphed is None:
            return "no launch figures (profiling failed; see launches.error)"
        graphed = self.graphed
        eager = self.eager.num_host_launches if self.eager is not None else None
        parts = [f"host launches {eager} eager -> {graphed.num_host_launches} graphed",
                 f"{graphed.num_graph_launches} cudaGraphLaunch",
                 f"{graphed.num_prologue_fill_launches} RNG prologue fills",
                 f"coverage {100 * graphed.graph_coverage:.0f}%"]
        if self.census_check is not None:
            parts.append("census = profiler" if self.census_check.match else "census != profiler")
        if self.tap_graph_nodes:
            parts.append(f"{self.tap_graph_nodes} graph nodes are graphdoctor's taps")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON view (schema 1 field names)."""
        out: dict[str, Any] = {"eager": self.eager.to_dict() if self.eager else None,
                               "graphed": self.graphed.to_dict() if self.graphed else None,
                               "trace": self.trace}
        if self.error is not None:
            out["error"] = self.error
        if self.census is not None:
            out["census"] = {c.name: {"num_nodes": c.num_nodes, "num_kernels": c.num_kernels,
                                      "nodes_by_type": dict(sorted(c.nodes_by_type.items())),
                                      "source": c.source} for c in self.census}
        if self.census_check is not None:
            out["census_check"] = self.census_check.to_dict()
        if self.census_error is not None:
            out["census_error"] = self.census_error
        if self.tap_graph_nodes is not None:
            out["tap_graph_nodes"] = self.tap_graph_nodes
        out["summary"] = self.summary
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchComparison:
        """Inverse of to_dict (the summary is recomputed)."""
        raw_census = data.get("census")
        census = None
        if isinstance(raw_census, dict):
            census = tuple(GraphCensus(name=name, source=str(c.get("source", "")),
                                       nodes_by_type={str(k): int(v) for k, v in
                                                      (c.get("nodes_by_type") or {}).items()})
                           for name, c in raw_census.items())
        check = data.get("census_check")
        return cls(
            eager=LaunchCount.from_dict(data["eager"]) if data.get("eager") else None,
            graphed=LaunchCount.from_dict(data["graphed"]) if data.get("graphed") else None,
            trace=data.get("trace"), census=census,
            census_check=CensusCheck(tuple(check["census_kernels_per_graph"]),
                                     tuple(check["profiler_kernels_per_launch"])) if check else None,
            census_error=data.get("census_error"), error=data.get("error"),
            tap_graph_nodes=data.get("tap_graph_nodes"))


def compare_launches(eager: LaunchCount | None, graphed: LaunchSection,
                     tap_graph_nodes: int | None = None) -> LaunchComparison:
    """The eager step beside a graphed run's profiled step, with the census check (`tap_graph_nodes`: the nodes
    graphdoctor's taps added to the graphed run's graphs, where it carried taps)."""
    check = None
    if graphed.census is not None:
        check = CensusCheck(
            tuple(sorted(c.num_kernels for c in graphed.census)),
            tuple(sorted(graphed.step.kernels_per_graph_launch)) if graphed.step else ())
    return LaunchComparison(eager=eager, graphed=graphed.step, trace=graphed.trace,
                            census=graphed.census, census_check=check,
                            census_error=graphed.census_error, error=graphed.error, tap_graph_nodes=tap_graph_nodes)


def _value(count: LaunchCount | None, key: str) -> Any:
    if count is None:
        return None
    if key == "_memops":
        return count.num_memcpy_calls + count.num_memset_calls
    value = getattr(count, key)
    return round(value, 6) if key == "graph_coverage" else value


def table_rows(eager: LaunchCount | None, graphed: LaunchCount | None) -> list[list[Any]]:
    """[label, eager value, graphed value] rows for rendering."""
    return [[label, _value(eager, key), _value(graphed, key)] for label, key in TABLE_ROWS]


__all__ = ["TABLE_ROWS", "CensusCheck", "LaunchComparison", "LaunchSection", "compare_launches",
           "table_rows"]
