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
OUTPUT_FORMAT_CHOICE = click.Choice(["full", "text", "table", "concise", "json", "github", "sarif", "markdown", "md"])

CHECK_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--config", {"type": click.Path(dir_okay=False), "metavar": "RUN.yaml", "multiple": True,
                  "help": "Run file with transformer:/env:/run: sections (same as a FILES argument; one "
                          "--config with one --megatron-args are checked merged). Repeatable. Default: none."}),
    ("--megatron-args", {"metavar": "ARGS|@FILE", "multiple": True,
                         "help": "A Megatron-LM launch line, or @file holding one. Repeatable. Default: none."}),
    ("--target", {"metavar": "FILE|local|k=v,...", "default": None,
                  "help": "The training machine the installation rules judge: a JSON file from `graphdoctor "
                          "env --json` run there, key=value items (te=2.12,torch=2.11,sm=90; te=none: no "
                          "TE), or local (this machine). Default: unknown (those rules report info "
                          "'not checked'); [tool.graphdoctor] target."}),
    ("--gpu-arch", {"metavar": "SM", "default": None,
                    "help": "Compute capability of the training GPU (sm_90, 9.0); overrides the target's. "
                            "Default: the target's, else unknown."}),
    ("--select", {"metavar": "CODES", "default": None,
                  "help": "Comma-separated rule codes or prefixes to report (GD4, GD301; static, and probe "
                          "codes with --probe). Default: all, or [tool.graphdoctor] select."}),
    ("--extend-select", {"metavar": "CODES", "default": None,
                         "help": "Codes or prefixes added to the selection. Default: none."}),
    ("--ignore", {"metavar": "CODES", "default": None,
                  "help": "Codes or prefixes never reported. Default: none, or [tool.graphdoctor] ignore."}),
    ("--output-format", {"type": OUTPUT_FORMAT_CHOICE, "default": None, "metavar": "FMT",
                         "help": "full (a block per finding: code, severity, message, where, fix; alias text), "
                                 "table, concise (path:line:col: GDxxx message), json, github (workflow "
                                 "annotations), sarif (SARIF 2.1.0) or markdown. Default: full, or "
                                 "[tool.graphdoctor] output-format."}),
    ("--format", {"type": OUTPUT_FORMAT_CHOICE, "default": None, "metavar": "FMT",
                  "help": "Alias of --output-format."}),
    ("--probe", {"is_flag": True, "default": False,
                 "help": "Also build the model on the GPU and probe each layer for capture-unsafe "
                         "operations (GD501-GD510); needs a CUDA GPU and one input at most. Default: off."}),
    ("--probe-timeout", {"type": float, "metavar": "SECONDS", "default": None,
                         "help": "Wall-clock limit of each probe worker process. Default: run.timeout_s "
                                 "of --config, else 300."}),
    ("--show-library-findings", {"is_flag": True, "default": False,
                                 "help": "With --probe, also report GD507 hits with no user frame on the stack "
                                         "(inside megatron/core, torch, TE, apex), marked "
                                         "extra.library_internal; otherwise one note counts them. Default: off."}),
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


def check_inputs(params: dict[str, Any]) -> list[Any]:
    """The CheckInputs of FILES (`@file`: a launch line), --config and --megatron-args."""
    from graphdoctor.rules.batch import CheckInput

    inputs = [CheckInput(megatron_args=f) if f.startswith("@") else CheckInput(run_file=f)
              for f in params.get("files") or ()]
    configs, lines = tuple(params.get("config") or ()), tuple(params.get("megatron_args") or ())
    if len(configs) == 1 and len(lines) == 1:
        inputs.append(CheckInput(run_file=configs[0], megatron_args=lines[0]))
    else:
        inputs.extend(CheckInput(run_file=c) for c in configs)
        inputs.extend(CheckInput(megatron_args=m) for m in lines)
    return inputs


def project_target(project: Any) -> str | None:
    """[tool.graphdoctor] target; a file there is relative to the pyproject.toml that names it."""
    target = project.target
    if target is None or target == "local" or "=" in target or project.path is None:
        return target
    return str(project.path.parent / target)


def _settings(params: dict[str, Any]) -> tuple[set[str] | None, Any, str]:
    """(selected codes or None, facts, output format) from the options over [tool.graphdoctor]."""
    from graphdoctor.rules import all_rules
    from graphdoctor.rules.selection import Selection, load_project_settings, split_codes
    from graphdoctor.rules.target import resolve_target

    project = load_project_settings()
    cli = Selection(select=split_codes(params.get("select")), ignore=split_codes(params.get("ignore")),
                    extend_select=split_codes(params.get("extend_select")))
    codes = cli.over(project.selection).codes([r.code for r in all_rules()])
    target = params.get("target") or project_target(project)
    if target is None and params.get("probe"):
        target = "local"  # the probes run on this GPU machine: it is the training machine
    facts = resolve_target(target, params.get("gpu_arch"))
    fmt = params.get("output_format") or params.get("format") or project.output_format or "full"
    if fmt not in OUTPUT_FORMAT_CHOICE.choices:
        raise UsageError(f"output-format: got {fmt!r}, expected one of {', '.join(OUTPUT_FORMAT_CHOICE.choices)}")
    return codes, facts, fmt


def collect_report(params: dict[str, Any]) -> tuple[Any, int, str]:
    """Build the BatchReport, exit code and output format for the parsed `check` options.

    Raises:
        UsageError: no input (no FILES, --config, --megatron-args nor --probe), bad options, or a single
            input that cannot be checked.
        NoGPUError: --probe and no CUDA device is visible.
    """
    from graphdoctor.rules.batch import BatchReport, check_many

    inputs = check_inputs(params)
    if not inputs and not params.get("probe"):
        raise UsageError("check: give run files or @launch-line files (or --config / --megatron-args), or --probe")
    codes, facts, fmt = _settings(params)
    if params.get("probe"):
        return (*_probed_report(params, inputs, codes, facts), fmt)
    batch = check_many(inputs, facts=facts, select=codes)
    if len(inputs) == 1 and batch.results[0].error is not None:
        raise UsageError(batch.results[0].error)
    ignored = _ignored_model_flags(params)
    if ignored:
        batch = BatchReport(results=batch.results, facts=batch.facts, notes=tuple(ignored))
    return batch, batch.exit_code(), fmt


def _probed_report(params: dict[str, Any], inputs: list[Any], codes: set[str] | None, facts: Any) -> tuple[Any, int]:
    from graphdoctor.cli.diff import build_config
    from graphdoctor.probes import check_with_probes
    from graphdoctor.rules.batch import BatchReport, CheckInput, suppress

    if len(inputs) > 1:
        raise UsageError(f"check --probe: got {len(inputs)} inputs, expected at most one run file (and launch line)")
    check_input = inputs[0] if inputs else CheckInput()
    config = build_config(check_input.run_file, {o.field: params[o.field] for o in PROBE_MODEL_OPTIONS if o.field})
    result = check_with_probes(config, check_input.run_file, check_input.megatron_args, facts=facts,
                               select=sorted(codes) if codes is not None else None, timeout_s=params["probe_timeout"],
                               show_library_findings=bool(params.get("show_library_findings")))
    batch = BatchReport(results=(suppress(check_input, result.report),), facts=facts)
    return batch, result.exit_code if result.exit_code == 2 else batch.exit_code()


def _ignored_model_flags(params: dict[str, Any]) -> list[str]:
    # A model flag without --probe is a no-op, not an error: say so in the report's notes.
    given = [f"--{o.name}" for o in PROBE_MODEL_OPTIONS if o.field and params.get(o.field) is not None]
    if params.get("probe_timeout") is not None:
        given.append("--probe-timeout")
    if params.get("show_library_findings"):
        given.append("--show-library-findings")
    return [f"{flag} has no effect without --probe" for flag in given]


@click.command("check")
@click.argument("files", nargs=-1, metavar="[FILES]...")
@_with_options(CHECK_OPTIONS)
@click_options(PROBE_MODEL_OPTIONS)
def check_command(**params: Any) -> None:
    """Check run files (RUN.yaml) and Megatron-LM launch lines (@launch.txt) against the CUDA-graph
    rule catalogue, all in one process; with --probe, also probe the model's layers on the GPU
    (model options below).

    Exit 0 when no error-level finding, 1 when there is one, 2 on bad input (each input that cannot
    be checked is one line on stderr; the others are still checked and reported), a probe failure or
    (with --probe) no GPU.
    """
    from graphdoctor.report.findings import render_batch

    report, exit_code, fmt = collect_report(params)
    for result in report.results:
        if result.error is not None:
            click.echo(f"graphdoctor: error: {result.error}", err=True)
    click.echo(render_batch(report, fmt), nl=False)
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


def _commands() -> list[click.Command]:
    from graphdoctor.cli.env import env_command

    return [check_command, rules_command, rule_command, env_command]


COMMANDS = _commands()

__all__ = ["CHECK_OPTIONS", "COMMANDS", "OUTPUT_FORMAT_CHOICE", "check_inputs", "project_target", "PROBE_MODEL_NAMES", "PROBE_MODEL_OPTIONS", "check_command", "collect_report",
           "rule_command", "rules_command", "write_rule_docs"]
