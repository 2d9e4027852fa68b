"""Exception hierarchy: everything graphdoctor raises derives from GraphDoctorError.

The CLI turns each of these into one line on stderr and exit code 2; a traceback never reaches a user.
"""

from __future__ import annotations


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


__all__ = [
    "GraphDoctorError",
    "InputFileError",
    "MissingDependencyError",
    "NoGPUError",
    "UsageError",
    "exception_chain",
]
