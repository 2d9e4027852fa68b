"""`graphdoctor count --trace FILE`: launch accounting of an existing profiler trace, on CPU.

Parse flags -> graphdoctor.launches.account_trace -> text table (and --json document). Imports
neither torch nor the GPU parts of graphdoctor.launches, so it starts fast.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("count")
@click.option(
    "--trace",
    "trace_path",
    required=True,
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Chrome trace from torch.profiler (.json or .json.gz). Default: none (required).",
)
@click.option(
    "--json",
    "json_path",
    default=None,
    metavar="PATH",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="Also write the accounting as JSON (schema_version 1); '-' for stdout instead of the "
    "table. Default: no JSON.",
)
def count_command(trace_path: Path, json_path: Path | None) -> None:
    """Count host launch calls, eager vs in-graph GPU kernels and RNG prologue fills in a
    profiler trace, per ProfilerStep and per graphdoctor phase."""
    from graphdoctor.launches.accounting import account_trace
    from graphdoctor.report.launches import render_launch_json, render_launch_text

    accounting = account_trace(trace_path)
    if json_path is not None and str(json_path) == "-":
        sys.stdout.write(render_launch_json(accounting))
        return
    click.echo(render_launch_text(accounting))
    if json_path is not None:
        try:
            json_path.write_text(render_launch_json(accounting), encoding="utf-8")
        except OSError as exc:
            from graphdoctor.errors import UsageError

            raise UsageError(f"--json: cannot write {str(json_path)!r}: {exc.strerror}") from exc


COMMANDS = [count_command]

__all__ = ["COMMANDS", "count_command"]
