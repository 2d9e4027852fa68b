"""The exit-code contract of every command: 2 for user errors (one line), 3 for bugs (one line,
traceback only with --debug)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import graphdoctor.memory.analysis as analysis
from graphdoctor.cli import main


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stderr


@pytest.mark.parametrize("args", [("triage",), ("triage", "--nope", "x"), ("count", "--trace"),
                                  ("rule",), ("nocommand",), ("check", "--format", "yaml")])
def test_click_usage_errors_are_one_line_exit_2(args: tuple[str, ...]) -> None:
    code, err = _run(*args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("graphdoctor: error: ")


def test_internal_error_is_exit_3_one_line_and_traceback_only_with_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("planted bug")

    monkeypatch.setattr("graphdoctor.cli.triage.triage", broken)
    code, err = _run("triage", str(analysis.__file__))
    assert code == 3 and len(err.strip().splitlines()) == 1
    assert "internal error" in err and "ZeroDivisionError: planted bug" in err and "--debug" in err
    code, err = _run("--debug", "triage", str(analysis.__file__))
    assert code == 3 and "Traceback" in err and "planted bug" in err


def test_dev_zero_and_fifo_are_not_regular_files(tmp_path: object) -> None:
    code, err = _run("triage", "/dev/zero")
    assert code == 2 and "not a regular file (a character device)" in err
    code, err = _run("count", "--trace", "/dev/zero")
    assert code == 2 and "not a regular file" in err
