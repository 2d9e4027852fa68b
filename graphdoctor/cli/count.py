"""`graphdoctor count`: launch accounting.

With `--trace FILE`: an existing profiler trace, on CPU (graphdoctor.launches.account_trace; imports
neither torch nor the GPU parts, so it starts fast). Without it: a quick live run on the GPU, eager
and each graphed implementation, no numeric diff (graphdoctor.count.count).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from graphdoctor.inputs import MAX_TRACE_BYTES, check_output_path, write_output
from graphdoctor.options import DIFF_OPTIONS, click_options

LIVE_FIELDS = frozenset({
    "impls", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
    "num_microbatches", "vocab_size", "dtype", "dropout", "steps", "seed",
    "cuda_graph_warmup_steps", "timeout_s", "layer_spec", "model_provider", "forward_step",
    "deterministic"})
"""DiffConfig fields that matter for a live count (the rest are about the numeric diff)."""

LIVE_OPTIONS = tuple(opt for opt in DIFF_OPTIONS if opt.field in LIVE_FIELDS)


@click.command("count")
@click.option(
    "--trace",
    "trace_path",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Analyse this Chrome trace from torch.profiler (.json or .json.gz) offline, on CPU. "
    "Default: none (a live run on the GPU).",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              metavar="RUN.yaml", help="Run file for a live run (as for diff). Default: none.")
@click_options(LIVE_OPTIONS)
@click.option("--trace-dir", "trace_dir", type=click.Path(file_okay=False), default=None,
              metavar="DIR", help="Live run: keep one Chrome trace per run (Perfetto) in DIR. "
              "Default: none.")
@click.option(
    "--json",
    "json_path",
    default=None,
    metavar="PATH",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="Also write the accounting as JSON (schema_version 1); '-' for stdout instead of the "
    "table. Default: no JSON.",
)
@click.option("--max-bytes", "max_bytes", metavar="BYTES", type=click.IntRange(min=1), default=MAX_TRACE_BYTES,
              help="With --trace: refuse traces larger than BYTES (decompressed). "
                   f"Default: {MAX_TRACE_BYTES}.")
def count_command(trace_path: Path | None, json_path: Path | None, config_path: str | None,
                  max_bytes: int, **values: object) -> None:
    """Count host launch calls, eager vs in-graph GPU kernels and RNG prologue fills.

    With --trace: in an existing profiler trace, per ProfilerStep and per graphdoctor phase (CPU).
    Without: profile one steady-state step of eager and of each graphed implementation of a real
    Megatron-Core model on the GPU (no numeric diff; `graphdoctor diff` includes the same table).
    """
    if trace_path is None:
        if max_bytes != MAX_TRACE_BYTES:
            from graphdoctor.errors import UsageError

            raise UsageError("--max-bytes: applies to --trace only, expected it with --trace")
        _live(config_path, json_path, values)
        return
    given = sorted(k for k, v in values.items() if v is not None)
    if given or config_path:
        from graphdoctor.errors import UsageError

        flag = "--config" if config_path else "--" + given[0].replace("_", "-")
        raise UsageError(f"{flag}: got a model option with --trace, expected one or the other")
    from graphdoctor.launches.accounting import account_trace
    from graphdoctor.report.launches import render_launch_json, render_launch_text

    if json_path is not None:
        check_output_path(json_path, "--json", [trace_path])
    accounting = account_trace(trace_path, max_bytes=max_bytes)
    if json_path is not None and str(json_path) == "-":
        write_output("-", render_launch_json(accounting))
        return
    click.echo(render_launch_text(accounting))
    if json_path is not None:
        write_output(json_path, render_launch_json(accounting), flag="--json", inputs=[trace_path])


def _live(config_path: str | None, json_path: Path | None, values: dict[str, object]) -> None:
    from graphdoctor.cli.diff import build_config, run_then_write
    from graphdoctor.count import CountReport, count
    from graphdoctor.report.count import render_count_text, write_count_json

    if json_path is not None:
        check_output_path(json_path, "--json", [config_path])
    config = build_config(config_path, values)

    def write(report: CountReport) -> None:  # the JSON first, then the summary
        if json_path is not None:
            write_count_json(report, json_path)
        click.echo(render_count_text(report))

    report = run_then_write(lambda board: count(config, progress=board), write, quiet=False)
    sys.exit(report.exit_code())


COMMANDS = [count_command]

__all__ = ["COMMANDS", "count_command"]
