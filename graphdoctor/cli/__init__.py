"""The `graphdoctor` click group: parse -> call the library -> render a report.

Each subcommand lives in its own module and is registered here. The exit-code contract lives here
too (docs/inputs.md): 0 clean, 1 findings/divergences, 2 any error the user can cause (a
GraphDoctorError or a click usage error: one line on stderr, never a traceback), 3 an internal
error (a bug: one line; the traceback only with `graphdoctor --debug`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

import click

from graphdoctor.errors import GraphDoctorError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_TOOL_ERROR = 2
EXIT_INTERNAL_ERROR = 3
EXIT_INTERRUPTED = 130

_DEBUG: dict[str, bool] = {"on": False, "verbose": False}


def _one_line(text: str) -> str:
    from graphdoctor.report.escape import escape_control

    return " ".join(escape_control(text).split("\n")).strip()


def _fail(message: str, code: int) -> int:
    click.echo(f"graphdoctor: {_one_line(message)}", err=True)
    return code


def _usage_message(exc: click.ClickException) -> str:
    ctx = getattr(exc, "ctx", None)
    where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"error: {exc.format_message()}{where}"


LIBRARY_WARNINGS = r"(megatron|transformer_engine|apex|absl|torch|modelopt|nvidia_resiliency_ext)(\..*)?$"
"""Modules whose warnings the CLI keeps off the terminal unless -v/--verbose is given."""


class _Group(click.Group):
    """Click group that owns the exit-code contract: one line on stderr for every error."""

    def invoke(self, ctx: click.Context) -> object:
        # torch logs "No CUDA runtime is found" from cpp_extension when megatron imports it on a
        # CPU machine: noise on every CPU command, never actionable there.
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        # megatron-core warns at import that Apex is missing (its norm falls back to torch's): the rules that
        # depend on Apex (GD308) and the refusals of what cannot build without it say so where it matters.
        warnings.filterwarnings("ignore", message="Apex is not installed", category=UserWarning)
        if not _DEBUG["verbose"]:
            # The libraries' import-time warnings (Transformer Engine or Apex missing, absl, deprecations): nothing
            # a reader of graphdoctor's output acts on; what matters is said as a finding, a note or a refusal.
            warnings.filterwarnings("ignore", module=LIBRARY_WARNINGS)
        return super().invoke(ctx)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        _DEBUG["on"] = False
        given = list(args) if args is not None else sys.argv[1:]
        _DEBUG["verbose"] = any(arg in ("-v", "--verbose") for arg in given)
        from graphdoctor.parent.stopping import Stopped, stop_children_on_signals

        try:
            with stop_children_on_signals():
                result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = result if isinstance(result, int) else EXIT_OK
        except Stopped as exc:  # SIGTERM/SIGHUP/SIGINT: the children are killed already (parent.stopping)
            code = _fail(f"stopped by {exc.signal_name}: every child process was ended", exc.exit_code)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_TOOL_ERROR)
        except click.exceptions.Abort:
            code = _fail("interrupted", EXIT_INTERRUPTED)
        except click.ClickException as exc:
            code = _fail(_usage_message(exc), EXIT_TOOL_ERROR)
        except GraphDoctorError as exc:
            code = _fail(f"error: {exc}", EXIT_TOOL_ERROR)
        except MemoryError:
            code = _fail("error: out of memory (an input larger than this machine can analyse?)", EXIT_TOOL_ERROR)
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # the reader of our stdout went away (| head)
                code = EXIT_OK
            else:
                code = _internal(exc)
        except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug, said as one line
            code = _internal(exc)
        if not standalone_mode:
            return code
        sys.exit(code)


def run() -> None:
    """The `graphdoctor` command (console script and `python -m graphdoctor`): main's exit code, and a prompt exit.

    With torch and Megatron imported (diff, advise, count), the interpreter's shutdown took seconds after the
    report was written (1.7 s on a 2-core CI machine); every output is written and closed by then, so the
    process flushes stdout and stderr and ends at once (os._exit). Callers that embed the CLI (click's
    CliRunner, the pytest plugin) call main itself and keep the interpreter.
    """
    code = main.main(standalone_mode=False)
    code = code if isinstance(code, int) else EXIT_OK
    if "torch" not in sys.modules:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _internal(exc: BaseException) -> int:
    if _DEBUG["on"]:
        traceback.print_exception(exc, file=sys.stderr)
    hint = "" if _DEBUG["on"] else "; rerun with `graphdoctor --debug ...` for the traceback"
    detail = str(exc).split("\n", 1)[0][:300]
    return _fail(f"internal error (a bug in graphdoctor): {type(exc).__name__}: {detail}{hint}",
                 EXIT_INTERNAL_ERROR)


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    _DEBUG["on"] = bool(value)
    return value


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="graphdoctor")
@click.option("--debug", is_flag=True, default=False, is_eager=True, expose_value=False, callback=_set_debug,
              help="On an internal error (exit 3), print the Python traceback too. Default: off.")
def main() -> None:
    """graphdoctor: is graphed Megatron-Core training computing the same thing as eager, is it
    safe, and what does it cost?

    Exit codes: 0 clean, 1 findings or divergences, 2 bad input or usage (one line on stderr),
    3 internal error (a bug; --debug prints the traceback).
    """


def _register() -> None:
    # Subcommands register themselves; imported lazily here so `graphdoctor --help` stays cheap
    # (no torch import until a command needs it).
    from graphdoctor.cli import diff as _diff

    main.add_command(_diff.diff_command)
    for name in ("check", "triage", "count", "report", "advise"):
        try:
            module = __import__(f"graphdoctor.cli.{name}", fromlist=["command"])
        except ModuleNotFoundError as exc:
            if exc.name != f"graphdoctor.cli.{name}":
                raise
            continue
        for command in getattr(module, "COMMANDS", ()):
            main.add_command(command)


_register()

__all__ = ["EXIT_FINDINGS", "EXIT_INTERNAL_ERROR", "EXIT_OK", "EXIT_TOOL_ERROR", "main", "run"]
