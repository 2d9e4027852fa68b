"""`graphdoctor triage SNAPSHOT`: offline, CPU-only analysis of a CUDA memory snapshot file.

Parse -> graphdoctor.memory.triage -> graphdoctor.report.memory. Never imports torch.
"""

from __future__ import annotations

import click

from graphdoctor.inputs import check_output_path, write_output
from graphdoctor.memory.analysis import triage
from graphdoctor.memory.loader import DEFAULT_MAX_BYTES

EXIT_OK = 0
EXIT_LEAK_SUSPECTS = 1


@click.command("triage")
@click.argument("snapshot", metavar="SNAPSHOT", type=click.Path(dir_okay=False))
@click.option("--against", "against", metavar="OTHER", type=click.Path(dir_okay=False), default=None,
              help="Baseline snapshot taken earlier: diff blocks OTHER -> SNAPSHOT and list leak suspects. "
                   "Default: none.")
@click.option("--json", "json_path", metavar="PATH", default=None,
              help="Write the report as JSON (schema_version 1) to PATH ('-' for stdout). Default: none.")
@click.option("--html", "html_path", metavar="PATH", default=None,
              help="Write one self-contained HTML page with charts to PATH. Default: none.")
@click.option("--all-frames", is_flag=True, default=False,
              help="Group by the whole Python stack instead of the first user frame. Default: off.")
@click.option("--top", metavar="N", type=click.IntRange(min=1), default=15, show_default=False,
              help="Rows per table (sites, diff groups, suspects). Default: 15.")
@click.option("--min-growth", "min_growth_bytes", metavar="BYTES", type=click.IntRange(min=1), default=1,
              help="With --against, a site is a leak suspect when its live bytes grow by at least BYTES. "
                   "Default: 1.")
@click.option("--trace", "with_trace", is_flag=True, default=False,
              help="Also unpickle the allocator history (device_traces) for the per-phase table and trace "
                   "entry counts, at several times the file size in memory (plain triage reads only the segments). "
                   "--html implies it for SNAPSHOT. Default: off.")
@click.option("--max-bytes", metavar="BYTES", type=click.IntRange(min=1), default=DEFAULT_MAX_BYTES,
              help=f"Refuse snapshots larger than BYTES (decompressed). Default: {DEFAULT_MAX_BYTES}.")
def triage_command(
    snapshot: str,
    against: str | None,
    json_path: str | None,
    html_path: str | None,
    all_frames: bool,
    top: int,
    min_growth_bytes: int,
    with_trace: bool,
    max_bytes: int,
) -> None:
    """Summarize a CUDA memory snapshot (torch.cuda.memory._dump_snapshot) without a GPU.

    Shows bytes by pool, stream and segment type, live bytes by allocation site, fragmentation and
    the largest free blocks. With --against OTHER, diffs blocks and lists leak suspects.
    The allocator history (device_traces) is skipped unless --trace or --html asks for it.
    The file is read with an unpickler that refuses all globals: nothing in it is executed.

    Exit codes: 0 ok, 1 leak suspects found (with --against), 2 bad input.
    """
    inputs = [snapshot, against]
    for flag, path in (("--json", json_path), ("--html", html_path)):
        if path is not None:
            check_output_path(path, flag, inputs)
    report = triage(
        snapshot,
        against=against,
        all_frames=all_frames,
        top=top,
        min_growth_bytes=min_growth_bytes,
        max_bytes=max_bytes,
        with_timeline=html_path is not None,
        with_trace=with_trace,
    )
    from graphdoctor.report.memory import render_json, render_text

    if json_path is not None:
        write_output(json_path, render_json(report), flag="--json", inputs=inputs)
    if html_path is not None:
        from graphdoctor.report.memory_html import render_html

        write_output(html_path, render_html(report), flag="--html", inputs=inputs)
    if json_path != "-":
        click.echo(render_text(report), nl=False)
    click.get_current_context().exit(EXIT_LEAK_SUSPECTS if report.has_leak_suspects else EXIT_OK)


COMMANDS = [triage_command]

__all__ = ["COMMANDS", "EXIT_LEAK_SUSPECTS", "EXIT_OK", "triage_command"]
