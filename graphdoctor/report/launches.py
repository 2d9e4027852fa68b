"""Text and JSON rendering of launch accounting (graphdoctor.launches.TraceAccounting).

Columns are per step: a record merged over several steps is divided by its num_steps. tabulate
is imported only when a table is drawn.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from graphdoctor.report.escape import escape_control

if TYPE_CHECKING:
    from graphdoctor.launches.counts import LaunchCount, TraceAccounting

_MAX_STEP_COLUMNS = 6


def _per_step(value: float, num_steps: int) -> str:
    if num_steps <= 1:
        return f"{value:g}" if isinstance(value, float) else str(value)
    mean = value / num_steps
    return str(int(mean)) if float(mean).is_integer() else f"{mean:.1f}"


def _graph_sizes(count: LaunchCount) -> str:
    sizes = count.kernels_per_graph_launch
    if not sizes:
        return "-"
    if len(set(sizes)) == 1:
        return f"{len(sizes)} x {sizes[0]}"
    shown = ", ".join(str(s) for s in sizes[:8])
    return shown + (f", ... ({len(sizes)} launches)" if len(sizes) > 8 else "")


def _rows(columns: Sequence[LaunchCount]) -> list[list[str]]:
    """Metric rows; one value column per LaunchCount."""
    apis = sorted({name for c in columns for name in c.launch_calls})

    def row(label: str, get: Any) -> list[str]:
        return [label, *(_per_step(get(c), c.num_steps) for c in columns)]

    rows = [
        ["steps", *(str(c.num_steps) for c in columns)],
        row("host time / step (ms)", lambda c: round(c.host_time_us / 1000.0, 3)),
        row("host launch calls", lambda c: c.num_host_launches),
        *(row(f"- {api}", lambda c, api=api: c.launch_calls.get(api, 0)) for api in apis),
        row("kernel launches", lambda c: c.num_kernel_launches),
        row("- of which RNG prologue fills", lambda c: c.num_prologue_fill_launches),
        row("graph launches", lambda c: c.num_graph_launches),
        row("memcpy / memset calls", lambda c: c.num_memcpy_calls + c.num_memset_calls),
        row("GPU kernels, eager", lambda c: c.num_gpu_kernels_eager),
        row("GPU kernels, RNG prologue", lambda c: c.num_gpu_kernels_prologue),
        row("GPU kernels, in graphs", lambda c: c.num_gpu_kernels_in_graph),
        ["kernels per graph launch", *(_graph_sizes(c) for c in columns)],
        ["graph coverage (GPU time)", *(f"{100 * c.graph_coverage:.1f}%" for c in columns)],
    ]
    if any(c.num_gpu_kernels_unattributed for c in columns):
        rows.append(row("GPU kernels, launch not in trace", lambda c: c.num_gpu_kernels_unattributed))
    return rows


def _table(headers: Sequence[str], columns: Sequence[LaunchCount]) -> str:
    from tabulate import tabulate

    return tabulate(_rows(columns), headers=["", *headers], tablefmt="simple", disable_numparse=True)


def render_launch_text(accounting: TraceAccounting) -> str:
    """Human-readable report: eager vs graphed per impl when phases exist, else per step.

    Args:
        accounting: Result of graphdoctor.launches.account_trace.

    Returns:
        Multi-line text (no trailing newline).
    """
    parts = [f"trace: {accounting.source} ({accounting.num_events} events)"]
    for table in accounting.tables:
        headers, columns = [], []
        for header, count in (("eager", table.eager), ("graphed", table.graphed)):
            if count is not None:
                headers.append(f"{table.impl} {header}")
                columns.append(count)
        parts.append(f"\n{table.impl}: per step, eager vs graphed\n" + _table(headers, columns))
    if not accounting.tables:
        steps = list(accounting.steps)
        if 1 < len(steps) <= _MAX_STEP_COLUMNS:
            columns = [*steps, accounting.total]
            parts.append("\n" + _table([s.label for s in steps] + ["total"], columns))
        else:
            label = "whole trace" if not steps else f"total over {len(steps)} steps, per step"
            parts.append(f"\n{label}\n" + _table(["total"], [accounting.total]))
    if accounting.total.num_gpu_kernels == 0:
        parts.append("\nnote: no GPU kernel events; was the trace recorded with ProfilerActivity.CUDA?")
    # annotation names and the path come from the trace: escaped before a terminal sees them
    return escape_control("\n".join(parts))


def render_launch_json(accounting: TraceAccounting) -> str:
    """The JSON document: the envelope of docs/json.md (command `count`) around
    TraceAccounting.to_dict() (docs/launches.md), indented, trailing newline."""
    from graphdoctor.envelope import envelope

    return json.dumps(envelope("count", accounting.to_dict()), indent=2, allow_nan=False) + "\n"


__all__ = ["render_launch_json", "render_launch_text"]
