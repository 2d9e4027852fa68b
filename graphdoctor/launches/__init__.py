"""graphdoctor.launches: profiler trace -> LaunchCount; graph census; NVTX phases; live profiling.

Importing this package never imports torch or touches CUDA; census, keep_graphs and profile_steps
import torch when called.
"""

from __future__ import annotations

from graphdoctor.launches.accounting import account_events, account_trace, build_tables
from graphdoctor.launches.census import (
    CensusError,
    GraphCensus,
    census_graph,
    census_raw_graph,
    parse_dot,
    parse_dot_file,
)
from graphdoctor.launches.counts import (
    PHASES,
    SCHEMA_VERSION,
    LaunchCount,
    LaunchTable,
    TraceAccounting,
    classify_host_call,
    merge_counts,
)
from graphdoctor.launches.kept import KeptGraphs, census_megatron, keep_graphs, megatron_graphs
from graphdoctor.launches.trace import TraceEvents, read_trace

# phases/profile import nvtx (which imports numpy, ~0.1 s); load them on first use so that
# `graphdoctor count` and the pure accounting stay fast.
_LAZY = {
    "phase": "graphdoctor.launches.phases",
    "phase_label": "graphdoctor.launches.phases",
    "ProfiledRun": "graphdoctor.launches.profile",
    "prepare_profiler_for_graphs": "graphdoctor.launches.profile",
    "profile_steps": "graphdoctor.launches.profile",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphdoctor.launches' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "PHASES",
    "SCHEMA_VERSION",
    "CensusError",
    "GraphCensus",
    "KeptGraphs",
    "LaunchCount",
    "LaunchTable",
    "ProfiledRun",
    "TraceAccounting",
    "TraceEvents",
    "account_events",
    "account_trace",
    "build_tables",
    "census_graph",
    "census_megatron",
    "census_raw_graph",
    "classify_host_call",
    "keep_graphs",
    "megatron_graphs",
    "merge_counts",
    "parse_dot",
    "parse_dot_file",
    "phase",
    "phase_label",
    "prepare_profiler_for_graphs",
    "profile_steps",
    "read_trace",
]
