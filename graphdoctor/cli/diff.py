"""`graphdoctor diff`: parse flags and the run file -> graphdoctor.diff.diff -> text and JSON report."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from graphdoctor.options import DIFF_OPTIONS, click_options

if TYPE_CHECKING:
    from graphdoctor.advise.plan import PlanOf


def build_config(config_path: str | None, values: dict[str, Any]) -> Any:
    """DiffConfig from the run file (if any) and flag values (a run file's `transformer:` keys are checked against
    TransformerConfig when it loads; a Megatron source's come from Megatron's own config class, MLA's included).

    Raises:
        UsageError: an unknown transformer field or a bad value.
        InputFileError: an unreadable or malformed run file.
    """
    from graphdoctor.config import diff_config_from, load_run_file

    run_file = load_run_file(config_path) if config_path else None
    return diff_config_from(run_file, **values)


@contextlib.contextmanager
def progress_board(quiet: bool) -> Iterator[Any]:
    """The progress board of a diff or live count on stderr, closed before the report prints."""
    from graphdoctor.parent.progress import ProgressBoard, progress_mode

    board = ProgressBoard(sys.stderr, progress_mode(sys.stderr, quiet=quiet))
    board.start()
    try:
        yield board
    finally:
        board.close()


def run_then_write[ReportT](run: Callable[[Any], ReportT], write: Callable[[ReportT], None],
                            quiet: bool) -> ReportT:
    """Run a command that starts children (diff, advise, live count) under its progress board, then write its
    report with `write`. Stopped by a signal (graphdoctor.parent.stopping), it still writes the partial report
    the command left on the Stopped, which then goes on to the CLI's one line and exit code 128 + the signal."""
    from graphdoctor.errors import Stopped

    try:
        with progress_board(quiet) as board:
            report = run(board)
    except Stopped as stop:
        if stop.report is not None:
            write(stop.report)
        raise
    write(report)
    return report


@click.command("diff")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              metavar="RUN.yaml",
              help="Run file (transformer:, env:, run:), a Megatron-LM functional test's model_config.yaml or a "
                   "Megatron-Bridge ConfigContainer YAML: the model as Megatron builds it. Default: none.")
@click_options(DIFF_OPTIONS)
@click.option("--set", "settings", multiple=True, metavar="model.FIELD=VALUE",
              help="A TransformerConfig field over the source's own (repeatable; VALUE read as a YAML scalar), as "
                   "Megatron-Bridge's overrides spell it: --set model.gradient_accumulation_fusion=false. "
                   "Default: none.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Write the full JSON report (schema in docs/diff.md). Default: none.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Write one self-contained HTML page of the run (docs/report.md). Default: none.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Keep child specs, events and logs here. Default: a temporary directory.")
@click.option("--plan", "plan_only", is_flag=True, default=False,
              help="Print the run as diff reads it (model, placement, each implementation screened by the rule "
                   "catalogue and Megatron's validation, the children it would start) and exit: no GPU needed, "
                   "nothing runs; with --json, the plan document (docs/json.md). Exit 0, or 1 when an implementation "
                   "has error-level findings.")
@click.option("-v", "--verbose", is_flag=True, default=False,
              help="Show traceback tails of failures. Default: off.")
@click.option("-q", "--quiet", is_flag=True, default=False,
              help="No progress on stderr (a live line per running child on a terminal, log lines "
                   "otherwise). Default: off.")
def diff_command(config_path: str | None, settings: tuple[str, ...], json_path: str | None, html_path: str | None,
                 workdir: str | None, plan_only: bool, verbose: bool, quiet: bool, **values: Any) -> None:
    """Train a real Megatron-Core GPT model eager and graphed side by side on the GPU and give a
    verdict per implementation (match, rng-divergence, numeric-divergence, capture-failed,
    crashed, hang, timeout, unavailable).

    \b
    From a Megatron-LM launch script, shrunk to one GPU:
      graphdoctor diff --megatron-args @pretrain_gpt.sh --num-layers 2 --seq-length 256

    Exit code 0 when every implementation passes (rng-divergence passes unless --strict-rng),
    1 otherwise, 2 for usage, config or environment errors (no GPU).
    """
    from graphdoctor.collector import collector_paused

    with collector_paused():  # the parent's imports of torch and Megatron, before its first child
        values = _under_torchrun(values)
        if not plan_only:
            start_template_early(values)
        if settings:
            values["transformer"] = parse_settings(settings)
        config = build_config(config_path, values)
        said_by = "launch line" if config.megatron_args or not config_path else "config"
        for note in config.launch_notes:  # on stderr where stdout carries the JSON (`--json -`)
            click.echo(f"{said_by}: {note}", err=json_path == "-")
        # Refused before any GPU work: a report never overwrites the run file or launch script it came from.
        line = config.megatron_args or ""
        inputs = [config_path, line[1:] if line.startswith("@") else None]
        if plan_only:
            write_plan("diff", config, json_path, html_path, inputs)
        from graphdoctor.inputs import check_output_path

        for flag, target in (("--json", json_path), ("--html", html_path)):
            if target:
                check_output_path(target, flag, inputs)
        if html_path and json_path and Path(html_path).resolve() == Path(json_path).resolve():
            from graphdoctor.errors import UsageError

            raise UsageError(f"--html {html_path}: the same file as --json; expected another path")
        from graphdoctor.diff.decide import diff
        from graphdoctor.parent.timeline import process_started_at

    started_at = process_started_at()
    report = run_then_write(lambda board: diff(config, workdir=workdir, progress=board, started_at=started_at),
                            lambda done: write_outputs(done, json_path, html_path, verbose), quiet)
    sys.exit(report.exit_code())


def start_template_early(values: dict[str, Any]) -> None:
    """Start the template the children are forked from now (graphdoctor.parent.template.start_early), so that its
    imports run beside this process's own reading of the run (a launch line resolved with Megatron-LM's parser takes
    as long as the imports), then import torch whole on this thread while the template imports (the template's
    threads import nothing; graphdoctor.diff.decide.import_torch_whole says why no thread may import part of torch
    beside it). Only where a one-process diff may run its children here: an NVIDIA device is present and visible,
    and no multi-GPU run is asked for."""
    if not children_may_run_here(values):
        return
    from graphdoctor.parent.runner import child_env
    from graphdoctor.parent.template import start_early

    start_early(child_env())
    from graphdoctor.diff.decide import import_torch_whole  # a third of a second's imports: after the template

    import_torch_whole()


def children_may_run_here(values: dict[str, Any]) -> bool:
    """Whether a one-process diff with these flag values may start children on this machine: an NVIDIA device
    node is present, CUDA_VISIBLE_DEVICES hides none of it, and no multi-GPU run is asked for."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (values.get("nproc_per_node") or 1) <= 1 and visible not in ("", "-1") and Path("/dev/nvidiactl").exists()


def parse_settings(settings: tuple[str, ...]) -> dict[str, Any]:
    """`--set model.FIELD=VALUE` (or `transformer.FIELD=VALUE`) -> {FIELD: VALUE}, VALUE a YAML scalar.

    Raises:
        UsageError: not KEY=VALUE, another prefix, or a value that is not a plain scalar.
    """
    import yaml

    from graphdoctor.errors import UsageError

    out: dict[str, Any] = {}
    for item in settings:
        key, sep, text = item.partition("=")
        section, _, name = key.strip().partition(".")
        if not sep or section not in ("model", "transformer") or not name.isidentifier():
            raise UsageError(f"--set {item}: expected model.FIELD=VALUE (a TransformerConfig field)")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            raise UsageError(f"--set {item}: VALUE is not a YAML scalar") from None
        if isinstance(value, dict | list):
            raise UsageError(f"--set {item}: VALUE must be a scalar (a number, true/false, a string or null)")
        out[name] = value
    return out


def write_plan(of: PlanOf, config: Any, json_path: str | None, html_path: str | None,
               inputs: list[str | None]) -> None:
    """`diff --plan` and `advise --plan` (decided in graphdoctor.advise.plan, rendered by graphdoctor.report.plan): the text (not with `--json -`), the `plan` JSON
    document where asked, and the plan's exit code.

    Raises:
        UsageError: `--html` (a page is a run's), an output onto an input.
    """
    from graphdoctor.advise.plan import make_plan
    from graphdoctor.errors import UsageError
    from graphdoctor.inputs import check_output_path, write_output
    from graphdoctor.report.plan import exit_code_of, plan_json, plan_text

    if html_path:
        raise UsageError(f"--html {html_path}: a page is written for a run; expected it without --plan "
                         "(--json writes the plan)")
    if json_path and json_path != "-":
        check_output_path(json_path, "--json", inputs)
    plan = make_plan(of, config)
    if json_path != "-":
        click.echo(plan_text(plan))
    if json_path:
        write_output(json_path, plan_json(plan) + "\n", flag="--json", inputs=inputs)
    sys.exit(exit_code_of(plan))


def write_outputs(report: Any, json_path: str | None, html_path: str | None, verbose: bool) -> None:
    """The JSON report first (quickest), the terminal summary, then the page."""
    from graphdoctor.report.diff import render_text, write_json

    if json_path:
        write_json(report, json_path)
    click.echo(render_text(report, verbose=verbose))
    if json_path:
        click.echo(f"report written to {json_path}")
    if html_path:
        # After the text, so a page that cannot be written never hides the run's results.
        from graphdoctor.report.html import render_payload, write_html

        write_html(render_payload(report.to_dict()), html_path)
        click.echo(f"page written to {html_path}")


def _under_torchrun(values: dict[str, Any]) -> dict[str, Any]:
    """Started by a user's torchrun: rank 0 runs the diff over every launched process (graphdoctor
    starts the children's ranks itself); the other ranks exit 0 at once, before touching CUDA."""
    from graphdoctor.parent.torchrun import leave_user_torchrun, under_user_torchrun

    placed = under_user_torchrun()
    if placed is None:
        return values
    rank, world = placed
    if rank != 0:
        click.echo(f"graphdoctor diff: rank {rank} of {world} under torchrun exits; rank 0 runs the diff "
                   f"and starts every child's {world} ranks itself", err=True)
        sys.exit(0)
    leave_user_torchrun()
    nproc = values.get("nproc_per_node") or world
    click.echo(f"graphdoctor diff: under torchrun with {world} processes: rank 0 runs the diff with "
               f"nproc_per_node {nproc}, the other ranks exit", err=True)
    return {**values, "nproc_per_node": nproc}


COMMANDS = [diff_command]

__all__ = ["COMMANDS", "build_config", "diff_command", "parse_settings", "progress_board", "run_then_write", "write_plan"]
