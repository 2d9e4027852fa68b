"""graphdoctor: CUDA-graph capture debugging and correctness toolkit for Megatron-Core.

The public API, importable without click and without touching CUDA (names load lazily):
`diff(DiffConfig) -> DiffReport`, `check(...) -> CheckReport`, `triage(path) -> TriageReport`,
`account_trace(path) -> TraceAccounting`, `probe(config) -> ProbeReport`;
`assert_graphs_match(report)` fails a test with a diff's verdict lines.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "DiffConfig": "graphdoctor.config",
    "load_run_file": "graphdoctor.config",
    "diff": "graphdoctor.diff",
    "DiffReport": "graphdoctor.diff",
    "assert_graphs_match": "graphdoctor.plugin_session",
    "Verdict": "graphdoctor.types",
    "RunRecord": "graphdoctor.protocol",
    "check": "graphdoctor.rules",
    "CheckReport": "graphdoctor.rules",
    "Finding": "graphdoctor.rules",
    "triage": "graphdoctor.memory",
    "TriageReport": "graphdoctor.memory",
    "account_trace": "graphdoctor.launches",
    "probe": "graphdoctor.probes",
    "GraphDoctorError": "graphdoctor.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'graphdoctor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
