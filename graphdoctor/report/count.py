"""Render a live CountReport: the eager-vs-graphed launch table and one line per implementation."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from graphdoctor.report.diff import launch_table_from_sections
from graphdoctor.strict_json import json_safe

if TYPE_CHECKING:
    from graphdoctor.count import CountReport


def render_count_text(report: CountReport) -> str:
    """Header, launch table, census and failure lines."""
    cfg = report.config
    env = report.eager.env
    lines = [f"graphdoctor count: GPTModel {cfg.num_layers}x{cfg.hidden_size}, seq "
             f"{cfg.seq_length}, mbs {cfg.micro_batch_size}x{cfg.num_microbatches}, {cfg.dtype}, "
             f"one profiled step after {cfg.steps} steps",
             f"  {(env.gpu if env else None) or '?'} | torch {env.torch if env else '?'} | megatron-core "
             f"{(env.megatron_core if env else None) or '?'}", ""]
    table = launch_table_from_sections(report.sections())
    if table:
        lines += [table, ""]
    for impl, section in report.sections():
        lines.append(f"{impl}: {section.summary}")
    for run in (report.eager, *report.runs):
        if run.status != "ok" and run.diagnosis is not None:
            lines.append(f"{run.impl}: {run.status}: {run.diagnosis.message}")
    for impl, why in report.unavailable.items():
        lines.append(f"{impl}: unavailable: {why}")
    if report.stopped is not None:
        lines.append(f"stopped by {report.stopped}: a partial count, the runs as the stop left them")
    lines.append(f"wall {report.wall_s:.1f} s; exit code {report.exit_code()}")
    return "\n".join(lines)


def write_count_json(report: CountReport, path: str | os.PathLike[str]) -> Path:
    """Write the JSON in the envelope of docs/json.md (command `count`; '-' is not supported for live runs)."""
    from graphdoctor.envelope import envelope

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(json_safe(envelope("count", report.to_dict())), indent=2, allow_nan=False,
                                 default=str) + "\n", encoding="utf-8")
    return target


__all__ = ["render_count_text", "write_count_json"]
