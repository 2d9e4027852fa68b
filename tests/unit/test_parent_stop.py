"""A stopped or killed graphdoctor parent takes every child with it: real processes (a parent that starts a
real torch.distributed.run launcher through graphdoctor's runner and launcher wrapper, with two real ranks;
a one-process child) are left behind by nothing once the parent gets SIGTERM or SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from graphdoctor.parent.stopping import STOP_SIGNALS, Stopped
from graphdoctor.protocol.processes import PARENT_PID_ENV

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")

RANK = """\
import sys, time
from pathlib import Path
from graphdoctor.child.distributed import die_with_launcher
die_with_launcher()  # as every graphdoctor rank does
Path(sys.argv[1] + "." + __import__("os").environ["RANK"]).write_text("up")
time.sleep(300)
"""

ONE_PROCESS = """\
import sys, time
from pathlib import Path
from graphdoctor.child.stacks import die_with_parent
assert die_with_parent()  # as every one-process child does
Path(sys.argv[1] + ".0").write_text("up")
time.sleep(300)
"""

PARENT = """\
import sys
from concurrent.futures import ThreadPoolExecutor
from graphdoctor.protocol.processes import launcher_command
from graphdoctor.parent.runner import python_command, run_isolated
from graphdoctor.parent.stopping import Stopped, stop_children_on_signals

child, ready, how = sys.argv[1], sys.argv[2], sys.argv[3]
argv = (launcher_command("--standalone", "--nproc-per-node=2", "--monitor-interval=0.2", child, ready)
        if how == "launched" else [sys.executable, "-P", child, ready])
try:
    with stop_children_on_signals():
        if how == "pool":  # as a diff's session runs children: worker threads, the main thread waiting
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda i: run_isolated([*argv[:-1], f"{ready}.w{i}"], timeout_s=240), range(2)))
        else:
            run_isolated(argv, timeout_s=240)
except Stopped as exc:
    raise SystemExit(exc.exit_code)
"""

_TOKENS: list[str] = []
"""The tokens of the processes the running test started."""


def _ours(token: str, but: int | None = None) -> list[str]:
    """`pid command` of every running (not zombie) process with `token` on its command line, `but` one."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.parent.name == str(but):
                continue
            command = cmdline.read_bytes()
            if token.encode() not in command:
                continue
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(f"{cmdline.parent.name} {command.replace(b'\0', b' ').decode()[:160]}")
    return found


def _default_stop_signals() -> None:
    """In the parent's process before exec: every stop signal as a terminal would deliver it."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _start(tmp_path: Path, launched: bool, *, pool: bool = False) -> tuple[subprocess.Popen[bytes], str, list[str]]:
    """The parent, once its child's processes are all up: (parent, token, their `pid command`)."""
    token = f"gd-stop-{uuid.uuid4().hex}"
    _TOKENS.append(token)
    child = tmp_path / f"{token}.py"
    child.write_text(RANK if launched else ONE_PROCESS)
    ready = tmp_path / f"{token}-ready"
    parent_script = tmp_path / "parent.py"
    parent_script.write_text(PARENT)
    how = "launched" if launched else "pool" if pool else "one"
    # Every stop signal at its default: a CI shell starts background jobs with SIGINT ignored, and a suite run under
    # nohup hands down SIGHUP ignored; the parent keeps an ignored signal ignored, as nohup asks.
    parent = subprocess.Popen([sys.executable, "-P", str(parent_script), str(child), str(ready), how],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_default_stop_signals)
    expected = ([Path(f"{ready}.w{i}.0") for i in range(2)] if pool else
                [Path(f"{ready}.{r}") for r in range(2 if launched else 1)])
    deadline = time.monotonic() + 90
    while not all(p.exists() for p in expected):
        assert parent.poll() is None, f"parent exited early: {parent.returncode}"
        assert time.monotonic() < deadline, f"child never came up: {_ours(token)}"
        time.sleep(0.1)
    return parent, token, _ours(token, but=parent.pid)


@pytest.fixture(autouse=True)
def _no_strays() -> object:
    """Should a test fail midway, its processes are still ended (by pid, each one this test started)."""
    yield
    while _TOKENS:
        for line in _ours(_TOKENS.pop()):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def _gone_within(token: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := _ours(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stopped_parent_kills_the_launcher_and_every_rank_and_exits_128_plus_the_signal(
        tmp_path: Path, sig: signal.Signals) -> None:
    parent, token, before = _start(tmp_path, launched=True)
    assert any("graphdoctor.child.stacks torch.distributed.run" in p for p in before), before
    assert len(before) == 3, before  # the launcher and its two ranks
    parent.send_signal(sig)
    assert parent.wait(timeout=30) == 128 + sig
    assert _gone_within(token, 5) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_ends_children_run_by_worker_threads_at_once(tmp_path: Path, sig: signal.Signals) -> None:
    """Two children run by worker threads while the main thread waits, as in a diff: before SIGINT was a stop
    signal, Ctrl-C raised KeyboardInterrupt there and the parent waited out its children's timeout."""
    parent, token, before = _start(tmp_path, launched=False, pool=True)
    assert len(before) == 2, before
    parent.send_signal(sig)
    assert parent.wait(timeout=30) == 128 + sig  # the children's limit is 240 s
    assert _gone_within(token, 5) == []


def test_a_sigkilled_parent_leaves_no_launcher_and_no_rank(tmp_path: Path) -> None:
    parent, token, before = _start(tmp_path, launched=True)
    assert len(before) == 3, before
    parent.kill()  # no clean-up of its own: the kernel's parent-death signal does it
    parent.wait(timeout=10)
    assert _gone_within(token, 20) == []


def test_a_sigkilled_parent_leaves_no_one_process_child(tmp_path: Path) -> None:
    parent, token, before = _start(tmp_path, launched=False)
    assert len(before) == 1, before
    parent.kill()
    parent.wait(timeout=10)
    assert _gone_within(token, 5) == []


def test_a_child_whose_parent_is_already_gone_exits_at_once() -> None:
    # The race: the parent died between starting the child and the child's prctl.
    env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}  # not the child's parent (that is the shell)
    done = subprocess.run(["sh", "-c", f"{sys.executable} -P -c 'from graphdoctor.child.stacks import "
                           "die_with_parent; die_with_parent(); print(1)'; true"], env=env, capture_output=True,
                          timeout=30, check=True)
    assert done.stdout == b""


def test_stopped_names_the_signal_and_the_exit_code() -> None:
    stopped = Stopped(signal.SIGTERM)
    assert (stopped.signal_name, stopped.exit_code) == ("SIGTERM", 143)
    assert not isinstance(stopped, Exception)  # no `except Exception` on the way up may swallow it


def test_the_cli_turns_a_stop_into_one_line_and_128_plus_the_signal(capsys: pytest.CaptureFixture[str]) -> None:
    import click

    from graphdoctor.cli import _Group

    @click.group(cls=_Group)
    def group() -> None:
        """A group like graphdoctor's."""

    @group.command("stop")
    def stop() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the real signal, through the real handler
        time.sleep(5)

    assert group.main(["stop"], standalone_mode=False) == 143
    assert capsys.readouterr().err == "graphdoctor: stopped by SIGTERM: every child process was ended\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is removed again
    from graphdoctor.parent.runner import run_isolated

    # and the next command in this process may start children again
    assert run_isolated([sys.executable, "-c", "pass"], timeout_s=30).returncode == 0


def test_an_ignored_sighup_stays_ignored_under_nohup() -> None:
    from graphdoctor.parent.stopping import stop_children_on_signals

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_children_on_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
