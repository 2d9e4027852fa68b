"""`graphdoctor check`, `graphdoctor rules` and `graphdoctor rule CODE`: parse -> library -> report.

`check` options live in one table (CHECK_OPTIONS); the model options of `--probe` are rows of
graphdoctor.options.DIFF_OPTIONS (PROBE_MODEL_OPTIONS), shared with `graphdoctor diff`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from graphdoctor.errors import UsageError
from graphdoctor.options import DIFF_OPTIONS, Option, click_options

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
                  "help": "Comma-separated rule codes to report (static, and probe codes with --probe). "
                          "Default: all."}),
    ("--format", {"type": FORMAT_CHOICE, "default": "text", "metavar": "FMT",
                  "help": "Output format: text, json or md. Default: text."}),
    ("--probe", {"is_flag": True, "default": False,
                 "help": "Also build the model on the GPU and probe each layer for capture-unsafe "
                         "operations (GD501-GD510); needs a CUDA GPU. Default: off."}),
    ("--probe-timeout", {"type": float, "metavar": "SECONDS", "default": None,
                         "help": "Wall-clock limit of each probe worker process. Default: run.timeout_s "
                                 "of --config, else 300."}),
]

PROBE_MODEL_NAMES: tuple[str, ...] = (
    "layer-spec", "model-provider", "forward-step", "num-layers", "hidden-size", "num-attention-heads",
    "seq-length", "micro-batch-size", "vocab-size", "dtype", "dropout", "seed",
)
PROBE_MODEL_OPTIONS: tuple[Option, ...] = tuple(o for o in DIFF_OPTIONS if o.name in PROBE_MODEL_NAMES)
"""The DIFF_OPTIONS rows `check --probe` takes (the model to probe); they only act with --probe."""
assert len(PROBE_MODEL_OPTIONS) == len(PROBE_MODEL_NAMES), "a PROBE_MODEL_NAMES entry is not in DIFF_OPTIONS"


def _with_options(options: list[tuple[str, dict[str, Any]]]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for flag, kwargs in reversed(options):
            func = click.option(flag, **kwargs)(func)
        return func
    return decorate


def collect_report(params: dict[str, Any]) -> tuple[Any, int]:
    """Build the CheckReport and exit code for the parsed `check` options (static rules, then probes).

    Raises:
        UsageError: no input (neither --config, --megatron-args nor --probe), or bad input.
        NoGPUError: --probe and no CUDA device is visible.
    """
    from graphdoctor.rules import check, detect_facts

    if params["config"] is None and params["megatron_args"] is None and not params["probe"]:
        raise UsageError("check: give --config RUN.yaml and/or --megatron-args, or --probe")
    select = [c.strip() for c in params["select"].split(",") if c.strip()] if params["select"] else None
    if select:
        from graphdoctor.rules import get_rule

        for code in select:
            get_rule(code)
    if params["probe"]:
        return _probed_report(params, select)
    report = check(params["config"], params["megatron_args"], facts=detect_facts(params["gpu_arch"]), select=select)
    report = report.merged((), _ignored_model_flags(params))
    return report, 1 if report.has_errors else 0


def _probed_report(params: dict[str, Any], select: list[str] | None) -> tuple[Any, int]:
    from graphdoctor.cli.diff import build_config
    from graphdoctor.probes import check_with_probes
    from graphdoctor.rules import detect_facts

    config = build_config(params["config"], {o.field: params[o.field] for o in PROBE_MODEL_OPTIONS if o.field})
    result = check_with_probes(config, params["config"], params["megatron_args"],
                               facts=detect_facts(params["gpu_arch"]), select=select,
                               timeout_s=params["probe_timeout"])
    return result.report, result.exit_code


def _ignored_model_flags(params: dict[str, Any]) -> list[str]:
    # A model flag without --probe is a no-op, not an error: say so in the report's notes.
    given = [f"--{o.name}" for o in PROBE_MODEL_OPTIONS if o.field and params[o.field] is not None]
    if params["probe_timeout"] is not None:
        given.append("--probe-timeout")
    return [f"{flag} has no effect without --probe" for flag in given]


@click.command("check")
@_with_options(CHECK_OPTIONS)
@click_options(PROBE_MODEL_OPTIONS)
def check_command(**params: Any) -> None:
    """Check a run file and/or a Megatron-LM launch line against the CUDA-graph rule catalogue;
    with --probe, also probe the model's layers on the GPU (model options below).

    Exit 0 when no error-level finding, 1 when there is one, 2 on bad input, a probe failure or
    (with --probe) no GPU.
    """
    from graphdoctor.report.findings import render_report

    report, exit_code = collect_report(params)
    click.echo(render_report(report, params["format"]), nl=False)
    sys.exit(exit_code)


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
    """Write docs/rules: GDxxx.md per rule and index.md (graphdoctor.report.rule_pages: only its own
    pages, recorded in a manifest; stale pages it wrote are removed, nothing else).

    Raises:
        UsageError: a page would overwrite a file graphdoctor did not write, or DIR cannot be written.
    """
    from graphdoctor.report.rule_pages import write_rule_pages
    from graphdoctor.rules import all_rules

    return write_rule_pages(directory, all_rules())


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

__all__ = ["CHECK_OPTIONS", "COMMANDS", "PROBE_MODEL_NAMES", "PROBE_MODEL_OPTIONS", "check_command", "collect_report",
           "rule_command", "rules_command", "write_rule_docs"]
