"""Eager step vs graphed step: the launch section of a diff row, and the census-vs-profiler check.

Pure Python over the dicts the children send back (LaunchCount.to_dict, GraphCensus.to_dict).
"""

from __future__ import annotations

from typing import Any

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


def _value(step: dict[str, Any] | None, key: str) -> Any:
    if step is None:
        return None
    if key == "_memops":
        return int(step.get("num_memcpy_calls", 0)) + int(step.get("num_memset_calls", 0))
    return step.get(key)


def table_rows(eager: dict[str, Any] | None, graphed: dict[str, Any] | None) -> list[list[Any]]:
    """[label, eager value, graphed value] rows for rendering."""
    return [[label, _value(eager, key), _value(graphed, key)] for label, key in TABLE_ROWS]


def census_check(census: dict[str, Any], graphed: dict[str, Any] | None) -> dict[str, Any]:
    """Compare census kernel counts per graph with the profiler's kernels per graph launch.

    Each graph Megatron holds is launched once per training step, so the multiset of census kernel
    counts must equal the multiset of per-launch kernel counts of the profiled step.
    """
    counts = sorted(int(c["num_kernels"]) for c in census.values() if "num_kernels" in c)
    launched = sorted(int(n) for n in (graphed or {}).get("kernels_per_graph_launch", []))
    return {"census_kernels_per_graph": counts, "profiler_kernels_per_launch": launched,
            "match": bool(counts) and counts == launched}


def launch_section(eager: dict[str, Any] | None, graphed_section: dict[str, Any]) -> dict[str, Any]:
    """The `launches` field of one implementation in the diff JSON."""
    graphed = graphed_section.get("step")
    section: dict[str, Any] = {"eager": eager, "graphed": graphed,
                               "trace": graphed_section.get("trace")}
    if "error" in graphed_section:
        section["error"] = graphed_section["error"]
    census = graphed_section.get("census")
    if isinstance(census, dict) and "error" not in census:
        section["census"] = {name: {k: c.get(k) for k in ("num_nodes", "num_kernels",
                                                          "nodes_by_type", "source")}
                             for name, c in census.items()}
        section["census_check"] = census_check(census, graphed)
    elif isinstance(census, dict):
        section["census_error"] = census["error"]
    section["summary"] = summary_line(eager, graphed, section.get("census_check"))
    return section


def summary_line(eager: dict[str, Any] | None, graphed: dict[str, Any] | None,
                 check: dict[str, Any] | None) -> str:
    """One line: host launches eager -> graphed, graph launches, coverage, census agreement."""
    if graphed is None:
        return "no launch figures (profiling failed; see launches.error)"
    parts = [f"host launches {_value(eager, 'num_host_launches')} eager -> "
             f"{graphed.get('num_host_launches')} graphed",
             f"{graphed.get('num_graph_launches')} cudaGraphLaunch",
             f"{graphed.get('num_prologue_fill_launches')} RNG prologue fills",
             f"coverage {100 * float(graphed.get('graph_coverage') or 0):.0f}%"]
    if check is not None:
        parts.append("census = profiler" if check["match"] else "census != profiler")
    return ", ".join(parts)


__all__ = ["TABLE_ROWS", "census_check", "launch_section", "summary_line", "table_rows"]
