"""`graphdoctor advise`: the model options of `diff` -> graphdoctor.advise.advise -> table and JSON."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from graphdoctor.cli.diff import build_config, run_then_write, write_plan
from graphdoctor.options import DIFF_OPTIONS, click_options

if TYPE_CHECKING:
    from graphdoctor.advise import AdviseReport


@click.command("advise")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None, metavar="RUN.yaml",
              help="Run file (transformer:, env:, run:), a Megatron-LM functional test's model_config.yaml or a "
                   "Megatron-Bridge ConfigContainer YAML (as for diff). Default: none.")
@click_options(DIFF_OPTIONS)
@click.option("--max-candidates", type=click.IntRange(min=1), default=32, metavar="N",
              help="Graphed configurations to run at most, candidates first, then bisection runs; the "
                   "others are listed as not run. Default: 32.")
@click.option("--time-budget", "time_budget_s", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS",
              help="No child starts after this many seconds; results so far are written and the rest "
                   "listed as not run. Default: none.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Write the JSON document (command advise; docs/advise.md). Default: none.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Write one self-contained HTML page of the advise (recommendation, candidates, "
                   "bisections, rejections). Default: none.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Keep child specs, events and logs here. Default: a temporary directory.")
@click.option("--plan", "plan_only", is_flag=True, default=False,
              help="List the candidates with what screening decided (run, rejected with the rule, unavailable) "
                   "and exit: no GPU needed, nothing runs. With --json, the plan document (docs/json.md). Exit 0, or 1 "
                   "when no candidate would run.")
@click.option("-q", "--quiet", is_flag=True, default=False,
              help="No progress on stderr (a live line per running child). Default: off.")
def advise_command(config_path: str | None, max_candidates: int, time_budget_s: float | None,
                   json_path: str | None, html_path: str | None, workdir: str | None, plan_only: bool,
                   quiet: bool, **values: Any) -> None:
    """Find the fastest CUDA-graph configuration that still trains like eager: run eager once and
    every candidate (full_iteration; local whole layer and per scope; transformer_engine per scope and
    scope combination), each judged as `graphdoctor diff` judges it, with step time and spread,
    graph-pool memory and launches. Candidates that Megatron's validation or the rule catalogue
    reject are listed with the rule instead of run. A candidate that differs numerically is narrowed
    scope by scope, then layer by layer. --impl limits the implementations considered;
    --cuda-graph-modules is not used (advise picks the scopes).

    Exit code 0 when a candidate passes (the recommendation, or "no graph configuration is
    measurably faster"), 1 when every candidate diverges or fails, 2 for usage, config or
    environment errors (no GPU).
    """
    config = build_config(config_path, values)
    if plan_only:
        write_plan("advise", config, json_path, html_path, [config_path])
    from graphdoctor.inputs import check_output_path

    # Refused before any GPU work: an output never overwrites the run file or the other output.
    for flag, target in (("--json", json_path), ("--html", html_path)):
        if target:
            check_output_path(target, flag, [config_path])
    if html_path and json_path and Path(html_path).resolve() == Path(json_path).resolve():
        from graphdoctor.errors import UsageError

        raise UsageError(f"--html {html_path}: the same file as --json; expected another path")
    from graphdoctor.advise import advise

    report = run_then_write(
        lambda board: advise(config, max_candidates=max_candidates, time_budget_s=time_budget_s,
                             workdir=Path(workdir) if workdir else None, progress=board),
        lambda done: _write_outputs(done, json_path, html_path), quiet)
    sys.exit(report.exit_code())


def _write_outputs(report: AdviseReport, json_path: str | None, html_path: str | None) -> None:
    """The JSON report first, the terminal summary, then the page."""
    from graphdoctor.report.advise import render_text, write_json

    if json_path:
        write_json(report, json_path)
    click.echo(render_text(report))
    if json_path:
        click.echo(f"report written to {json_path}")
    if html_path:
        from graphdoctor.report.advise_html import render_html
        from graphdoctor.report.html import write_html

        write_html(render_html(report), html_path)
        click.echo(f"page written to {html_path}")


COMMANDS = [advise_command]

__all__ = ["COMMANDS", "advise_command"]
