"""Exception hierarchy: everything graphdoctor raises derives from GraphDoctorError.

The CLI turns each of these into one line on stderr and exit code 2; a traceback never reaches a user.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


class GraphDoctorError(Exception):
    """Base class of every error graphdoctor raises on purpose."""


class UsageError(GraphDoctorError, ValueError):
    """Bad user input: a flag, a config field or a value. The message names field, got and expected."""


class InputFileError(GraphDoctorError, ValueError):
    """A file the user gave cannot be read, parsed or trusted."""


class NoGPUError(GraphDoctorError):
    """The command needs a CUDA GPU and none is visible."""


class MissingDependencyError(GraphDoctorError):
    """An optional dependency (for example Transformer Engine) is not installed."""


def exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` followed by its causes/contexts, newest first (the last one raised first)."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


@contextlib.contextmanager
def where_from(source: str) -> Iterator[None]:
    """Within: a UsageError or InputFileError is raised again with `source: ` before its message (the file
    and key a bad value came from, e.g. `run.yaml: run.megatron_args`)."""
    try:
        yield
    except (UsageError, InputFileError) as exc:
        raise type(exc)(f"{source}: {exc}") from None


def stopped_exit_code(signal_name: str) -> int:
    """128 + the number of the signal named `signal_name` (`SIGTERM`, ...; an unknown name counts as
    SIGTERM): the exit code of a command a signal stopped, and of its partial report."""
    return 128 + signal.Signals.__members__.get(signal_name, signal.SIGTERM).value


class Stopped(BaseException):  # noqa: N818 - like KeyboardInterrupt: a signal, not an error
    """The parent got a stop signal; its children are killed already. A BaseException on purpose, like
    KeyboardInterrupt: no `except Exception` on the way up may treat it as one failed child and go on."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.report: Any = None
        """The partial report of the command it stopped, where that command writes one (diff)."""

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process ended by it."""
        return 128 + self.signum

    @property
    def signal_name(self) -> str:
        """`SIGTERM`, `SIGHUP`, ..."""
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"


__all__ = [
    "GraphDoctorError",
    "InputFileError",
    "MissingDependencyError",
    "NoGPUError",
    "Stopped",
    "UsageError",
    "exception_chain",
    "stopped_exit_code",
    "where_from",
]
