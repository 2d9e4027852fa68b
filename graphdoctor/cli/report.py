"""`graphdoctor report REPORT.json --html PATH`: render a saved diff report as one HTML page (CPU only).

Parse -> graphdoctor.report.html.render_file. Reads the JSON of `graphdoctor diff --json` (schema 1),
gzipped or not, and the recorded tap-table files under fixtures/data/forensics; never imports torch.
"""

from __future__ import annotations

import click

from graphdoctor.errors import UsageError


@click.command("report")
@click.argument("report_path", metavar="REPORT.json", type=click.Path(dir_okay=False))
@click.option("--html", "html_path", metavar="PATH", default=None, type=click.Path(dir_okay=False),
              help="Write one self-contained HTML page (inline CSS and SVG, no network) to PATH. "
                   "Default: none.")
def report_command(report_path: str, html_path: str | None) -> None:
    """Render a saved `graphdoctor diff --json` report (or a recorded tap table) as an HTML page:
    run and verdicts, loss per step, grads and params per step on a log scale, first differing
    tensors, forensics, memory by phase, launches and the graph census.

    Exit codes: 0 written, 2 bad input (unreadable, not a diff report, or PATH is the input file).
    """
    from graphdoctor.report.html import render_file

    if html_path is None:
        raise UsageError("--html: missing; expected --html PATH (the page to write)")
    target = render_file(report_path, html_path)
    click.echo(f"report written to {target} ({target.stat().st_size} bytes)")


COMMANDS = [report_command]

__all__ = ["COMMANDS", "report_command"]
