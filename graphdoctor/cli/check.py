"""`graphdoctor check`, `graphdoctor rules` and `graphdoctor rule CODE`: parse -> library -> report.

`check` options live in one table (CHECK_OPTIONS) so that later stages (e.g. `--probe`) add a row
and a step in `collect_report` without touching the command body.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from graphdoctor.errors import InputFileError, UsageError

FORMAT_CHOICE = click.Choice(["text", "json", "md"])

CHECK_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--config", {"type": click.Path(dir_okay=False), "metavar": "RUN.yaml", "default": None,
                  "help": "Run file with transformer:/env:/run: sections. Default: none."}),
    ("--megatron-args", {"metavar": "ARGS|@FILE", "default": None,
                         "help": "A Megatron-LM launch line, or @file holding one. Default: none."}),
    ("--gpu-arch", {"metavar": "SM", "default": None,
                    "help": "Compute capability of the training GPU (sm_90, 9.0); read from torch when a GPU "
                            "is visible. Default: unknown."}),
    ("--select", {"metavar": "CODES", "default": None,
                  "help": "Comma-separated rule codes to run. Default: all static rules."}),
    ("--format", {"type": FORMAT_CHOICE, "default": "text", "metavar": "FMT",
                  "help": "Output format: text, json or md. Default: text."}),
]


def _with_options(options: list[tuple[str, dict[str, Any]]]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for flag, kwargs in reversed(options):
            func = click.option(flag, **kwargs)(func)
        return func
    return decorate


def collect_report(params: dict[str, Any]) -> Any:
    """Build the CheckReport for the parsed `check` options (static rules; probes plug in here).

    Raises:
        UsageError: neither --config nor --megatron-args given, or bad input.
    """
    from graphdoctor.rules import check, detect_facts

    if params["config"] is None and params["megatron_args"] is None:
        raise UsageError("check: give --config RUN.yaml and/or --megatron-args")
    if params["config"] is not None and not Path(params["config"]).is_file():
        raise InputFileError(f"{params['config']}: no such file")
    select = [c.strip() for c in params["select"].split(",") if c.strip()] if params["select"] else None
    if select:
        from graphdoctor.rules import get_rule

        for code in select:
            get_rule(code)
    return check(params["config"], params["megatron_args"], facts=detect_facts(params["gpu_arch"]), select=select)


@click.command("check")
@_with_options(CHECK_OPTIONS)
def check_command(**params: Any) -> None:
    """Check a run file and/or a Megatron-LM launch line against the CUDA-graph rule catalogue.

    Exit 0 when no error-level finding, 1 when there is one, 2 on bad input.
    """
    from graphdoctor.report.findings import render_report

    report = collect_report(params)
    click.echo(render_report(report, params["format"]), nl=False)
    sys.exit(1 if report.has_errors else 0)


@click.command("rules")
@click.option("--format", "fmt", type=FORMAT_CHOICE, default="text", metavar="FMT",
              help="Output format: text, json or md. Default: text.")
@click.option("--output", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Write one Markdown page per rule plus index.md into DIR (implies md). Default: stdout.")
@click.option("--all", "all_", is_flag=True, default=False, help="Accepted for compatibility; all rules are listed. Default: off.")
def rules_command(fmt: str, output: str | None, all_: bool) -> None:
    """List the rule catalogue."""
    from graphdoctor.report.findings import render_rules
    from graphdoctor.rules import all_rules

    rules = all_rules()
    if output is None:
        click.echo(render_rules(rules, fmt), nl=False)
        return
    if fmt not in ("md", "text"):
        raise UsageError(f"--output: got --format {fmt}, expected md (pages are Markdown)")
    written = write_rule_docs(Path(output))
    click.echo(f"wrote {len(written)} files to {output}")


def write_rule_docs(directory: Path) -> list[Path]:
    """Write docs/rules: GDxxx.md per rule and index.md; stale GDxxx.md pages are removed.

    Raises:
        InputFileError: the directory cannot be written.
    """
    from graphdoctor.report.findings import rule_markdown, rules_index_markdown
    from graphdoctor.rules import all_rules

    rules = all_rules()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        keep = {f"{r.code}.md" for r in rules} | {"index.md"}
        for old in directory.glob("GD*.md"):
            if old.name not in keep:
                old.unlink()
        written = []
        for rule in rules:
            path = directory / f"{rule.code}.md"
            path.write_text(rule_markdown(rule), encoding="utf-8")
            written.append(path)
        index = directory / "index.md"
        index.write_text(rules_index_markdown(rules), encoding="utf-8")
    except OSError as exc:
        raise InputFileError(f"{directory}: cannot write ({exc.strerror or exc})") from None
    return [*written, index]


@click.command("rule")
@click.argument("code", metavar="CODE")
@click.option("--format", "fmt", type=FORMAT_CHOICE, default="text", metavar="FMT",
              help="Output format: text, json or md. Default: text.")
def rule_command(code: str, fmt: str) -> None:
    """Show one rule: name, code, family, severity, fix availability, status and full doc."""
    from graphdoctor.report.findings import render_rule
    from graphdoctor.rules import get_rule

    click.echo(render_rule(get_rule(code), fmt), nl=False)


COMMANDS = [check_command, rules_command, rule_command]

__all__ = ["CHECK_OPTIONS", "COMMANDS", "check_command", "collect_report", "rule_command", "rules_command",
           "write_rule_docs"]
