"""Launch figures counted event by event from a recorded Chrome trace, without graphdoctor.launches: the
independent count that the tests on real traces hold the launch accounting against.

Deliberately plain: phase ranges are the CPU `user_annotation` events named `graphdoctor/<impl>/<phase>/<step>`,
a launch call belongs to the range its timestamp falls in, and a GPU kernel or memory operation belongs to the
launch call with the same `args.correlation`.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Event = dict[str, Any]

KERNEL_APIS = ("cudaLaunchKernel", "cuLaunchKernel")
"""Name prefixes of kernel launch calls (cudaLaunchKernelExC, cuLaunchKernelEx, ... included)."""
GRAPH_APIS = ("cudaGraphLaunch", "cuGraphLaunch")
MEMCPY_APIS = ("cudaMemcpy", "cuMemcpy")
MEMSET_APIS = ("cudaMemset", "cuMemset")
FILL_KERNEL = "FillFunctor"
"""In the name of the kernel `CUDAGraph.replay()` fills the RNG seed and offset with."""


def load_events(path: Path) -> list[Event]:
    """The `traceEvents` of a `.json` or `.json.gz` Chrome trace."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            document = json.load(fh)
    else:
        document = json.loads(path.read_text(encoding="utf-8"))
    return document["traceEvents"] if isinstance(document, dict) else document


def phase_ranges(events: list[Event]) -> list[tuple[str, float, float]]:
    """(name, start, end) of every CPU phase range, in time order."""
    ranges = [(e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events
              if e.get("cat") == "user_annotation" and e.get("ph") == "X"
              and e.get("name", "").startswith("graphdoctor/") and e["name"].count("/") >= 3]
    return sorted(ranges, key=lambda r: r[1])


def _kind(name: str) -> str | None:
    if name.startswith(KERNEL_APIS):
        return "kernel"
    if name.startswith(GRAPH_APIS):
        return "graph"
    if name.startswith(MEMCPY_APIS):
        return "memcpy"
    if name.startswith(MEMSET_APIS):
        return "memset"
    return None


@dataclass
class RawCount:
    """What the launch calls of one time range launched, counted event by event."""

    launch_calls: Counter[str] = field(default_factory=Counter)
    calls_by_kind: Counter[str] = field(default_factory=Counter)
    kernels_by_kernel_calls: int = 0
    """GPU kernels launched by kernel launch calls (the RNG prologue fills included)."""
    kernels_per_graph_launch: list[int] = field(default_factory=list)
    prologue_fills: int = 0
    """Kernel launch calls of a fill kernel that come right before a graph launch on the same thread."""
    prologue_kernels: int = 0
    memops_outside_graphs: int = 0
    memops_in_graphs: int = 0
    kernel_time_outside_graphs_us: float = 0.0
    kernel_time_in_graphs_us: float = 0.0
    unattributed_kernels: int = 0
    """GPU kernels whose correlation id is no launch call's (whole trace only)."""

    def launch_fields(self) -> dict[str, Any]:
        """The counts under the names of graphdoctor.launches.LaunchCount.to_dict."""
        kinds = self.calls_by_kind
        return {
            "launch_calls": dict(sorted(self.launch_calls.items())),
            "num_kernel_launches": kinds["kernel"], "num_graph_launches": kinds["graph"],
            "num_memcpy_calls": kinds["memcpy"], "num_memset_calls": kinds["memset"],
            "num_host_launches": sum(kinds.values()),
            "num_prologue_fill_launches": self.prologue_fills,
            "num_gpu_kernels_eager": self.kernels_by_kernel_calls - self.prologue_kernels,
            "num_gpu_kernels_prologue": self.prologue_kernels,
            "num_gpu_kernels_in_graph": sum(self.kernels_per_graph_launch),
            "kernels_per_graph_launch": list(self.kernels_per_graph_launch),
            "num_gpu_memops_eager": self.memops_outside_graphs,
            "num_gpu_memops_in_graph": self.memops_in_graphs,
        }

    @property
    def graph_coverage(self) -> float:
        """Share of the kernel time spent in graphs."""
        total = self.kernel_time_outside_graphs_us + self.kernel_time_in_graphs_us
        return self.kernel_time_in_graphs_us / total if total else 0.0


def count_launches(events: list[Event], start: float = float("-inf"), end: float = float("inf")) -> RawCount:
    """Count the launch calls whose timestamp lies in [start, end] and the GPU work they launched."""
    calls = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and _kind(e["name"])),
                   key=lambda e: (str(e.get("tid")), float(e["ts"])))
    kernels: dict[Any, list[Event]] = {}
    for event in events:
        if event.get("cat") == "kernel":
            kernels.setdefault(event["args"].get("correlation"), []).append(event)
    memops = Counter(e["args"].get("correlation") for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset"))
    out = RawCount()
    graph_launches: list[tuple[float, int]] = []
    for i, call in enumerate(calls):
        correlation = (call.get("args") or {}).get("correlation")
        launched = kernels.get(correlation, [])
        if not start <= float(call["ts"]) <= end:
            continue
        kind = _kind(call["name"])
        assert kind is not None
        out.launch_calls[call["name"]] += 1
        out.calls_by_kind[kind] += 1
        time_us = sum(float(k.get("dur", 0.0)) for k in launched)
        if kind == "graph":
            graph_launches.append((float(call["ts"]), len(launched)))
            out.memops_in_graphs += memops[correlation]
            out.kernel_time_in_graphs_us += time_us
            continue
        out.memops_outside_graphs += memops[correlation]
        out.kernel_time_outside_graphs_us += time_us
        if kind == "kernel":
            out.kernels_by_kernel_calls += len(launched)
        if kind == "kernel" and _is_prologue(calls, i, kernels):
            out.prologue_fills += 1
            out.prologue_kernels += len(launched)
    out.kernels_per_graph_launch = [n for _, n in sorted(graph_launches)]
    if start == float("-inf") and end == float("inf"):
        launched_ids = {(c.get("args") or {}).get("correlation") for c in calls}
        out.unattributed_kernels = sum(len(k) for c, k in kernels.items() if c not in launched_ids)
    return out


def _is_prologue(calls: list[Event], i: int, kernels: dict[Any, list[Event]]) -> bool:
    """The calls after calls[i] on its thread, up to the next graph launch, all launch fill kernels."""
    tid = calls[i].get("tid")
    for call in calls[i:]:
        if call.get("tid") != tid:
            return False
        if _kind(call["name"]) == "graph":
            return True
        launched = kernels.get((call.get("args") or {}).get("correlation"), [])
        if _kind(call["name"]) != "kernel" or not launched or not all(FILL_KERNEL in k["name"] for k in launched):
            return False
    return False
