"""The `graphdoctor` click group: parse -> call the library -> render a report.

Each subcommand lives in its own module and is registered here; every GraphDoctorError becomes one
line on stderr and exit code 2 (never a traceback).
"""

from __future__ import annotations

import logging
import sys

import click

from graphdoctor.errors import GraphDoctorError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_TOOL_ERROR = 2


class _Group(click.Group):
    """Click group that maps library errors to one line and exit code 2."""

    def invoke(self, ctx: click.Context) -> object:
        # torch logs "No CUDA runtime is found" from cpp_extension when megatron imports it on a
        # CPU machine: noise on every CPU command, never actionable there.
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        try:
            return super().invoke(ctx)
        except GraphDoctorError as exc:
            click.echo(f"graphdoctor: error: {exc}", err=True)
            sys.exit(EXIT_TOOL_ERROR)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="graphdoctor")
def main() -> None:
    """graphdoctor: is graphed Megatron-Core training computing the same thing as eager, is it
    safe, and what does it cost?"""


def _register() -> None:
    # Subcommands register themselves; imported lazily here so `graphdoctor --help` stays cheap
    # (no torch import until a command needs it).
    from graphdoctor.cli import diff as _diff

    main.add_command(_diff.diff_command)
    for name in ("check", "triage", "count", "report"):
        try:
            module = __import__(f"graphdoctor.cli.{name}", fromlist=["command"])
        except ModuleNotFoundError as exc:
            if exc.name != f"graphdoctor.cli.{name}":
                raise
            continue
        for command in getattr(module, "COMMANDS", ()):
            main.add_command(command)


_register()

__all__ = ["EXIT_FINDINGS", "EXIT_OK", "EXIT_TOOL_ERROR", "main"]
