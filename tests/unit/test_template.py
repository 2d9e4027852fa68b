"""Children forked from the template process (graphdoctor/parent/template.py, graphdoctor/child/template.py), on
the CPU with real processes: the template imports once and forks the real `graphdoctor.child` entry, which runs
to its error event here (no CUDA) and exits 3 as a started interpreter would; a child held at its memory gate
is timed out, asked for its stacks and killed like a started one, with nothing left running; a child whose
environment differs from the template's starts as its own interpreter; closing the session ends the template."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphdoctor.config import DiffConfig
from graphdoctor.parent import template as parent_template
from graphdoctor.parent.runner import child_env, python_command, run_isolated
from graphdoctor.parent.template import SWITCH_ENV, ForkTemplate, enabled, same_imports
from graphdoctor.protocol.events import read_events
from graphdoctor.protocol.spec import ChildSpec, Placement, Role, run_name

IMPORT_BOUND_S = 240.0
"""The template's imports of torch and Megatron on a slow CI machine."""


def _spec(tmp_path: Path, name: str, **kwargs: object) -> Path:
    spec = ChildSpec(impl="local", dropout=0.0, config=DiffConfig(timeout_s=IMPORT_BOUND_S), role=Role.GRAPHED,
                     name=name, events_path=str(tmp_path / f"events-{name}.jsonl"), reference_dir=str(tmp_path),
                     placement=Placement(master_port=29999), **kwargs)  # type: ignore[arg-type]
    return spec.write(tmp_path / f"spec-{name}.json")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkTemplate]:
    log = tmp_path_factory.mktemp("template") / "log-template.txt"
    made = ForkTemplate(child_env(), log)
    assert made.wait_ready(IMPORT_BOUND_S), (made.failed, log.read_text())
    yield made
    made.close()
    assert made._proc.poll() is not None


def test_a_forked_child_runs_the_child_entry_to_its_error_event(template: ForkTemplate, tmp_path: Path) -> None:
    name = run_name("local", 0.0, Role.GRAPHED)
    spec = _spec(tmp_path, name)
    argv = python_command("graphdoctor.child", str(spec))
    assert template.serves(argv, child_env())
    ended = run_isolated(argv, timeout_s=IMPORT_BOUND_S, log_path=tmp_path / "log.txt", env=child_env(),
                         template=template, stacks_prefix=tmp_path / f"stacks-{name}")
    assert ended.returncode == 3 and not ended.timed_out
    kinds = [type(e).__name__ for e in read_events(str(tmp_path / f"events-{name}.jsonl")).events]
    assert kinds[0] == "Started" and kinds[-1] == "Error", kinds
    assert template.ready_s is not None and template.ready_s > 0
    assert template.ready_at is not None and template.started_at < template.ready_at  # the report's timeline
    with template._cond:
        assert len(template._pids) >= 1 and set(template._pids) == set(template._exits)


def test_a_forked_child_held_at_its_gate_is_timed_out_and_killed(template: ForkTemplate, tmp_path: Path) -> None:
    name = "held"
    spec = _spec(tmp_path, name, memory_gate=str(tmp_path / "memory-1"))  # never opened
    ended = run_isolated(python_command("graphdoctor.child", str(spec)), timeout_s=3.0,
                         log_path=tmp_path / "log.txt", env=child_env(), template=template,
                         stacks_prefix=tmp_path / f"stacks-{name}")
    assert ended.timed_out and ended.group_gone and ended.left_running == ()
    assert ended.returncode is not None and ended.returncode < 0
    assert any("wait_at_gate" in text for _, text in ended.stacks), ended.stacks


def test_the_template_outlives_the_thread_that_asked_for_it(tmp_path: Path) -> None:
    """The kernel's parent-death signal follows the thread that started a process: a template asked for on a
    short-lived thread must still serve once that thread has ended."""
    made: list[ForkTemplate] = []

    def ask() -> None:  # ends once the template is ready, so after it asked for the signal
        made.append(ForkTemplate(child_env(), tmp_path / "log-template.txt"))
        made[0].wait_ready(IMPORT_BOUND_S)

    asker = threading.Thread(target=ask)
    asker.start()
    asker.join()
    (late,) = made
    try:
        assert late.ready_s is not None, (late.failed, (tmp_path / "log-template.txt").read_text())
        time.sleep(0.5)  # the signal, were it sent, has arrived
        ended = run_isolated(python_command("graphdoctor.child", str(_spec(tmp_path, "late"))),
                             timeout_s=IMPORT_BOUND_S, log_path=tmp_path / "log.txt", env=child_env(), template=late)
        assert ended.returncode == 3 and late.failed is None
    finally:
        late.close()


def test_a_template_that_does_not_fork_is_ended_and_the_child_started(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A template stopped after its imports never reports the child's pid: after SPAWN_WAIT_S it counts as failed
    and is killed, and the runner starts the child as its own interpreter, which runs to its error event."""
    monkeypatch.setattr(parent_template, "SPAWN_WAIT_S", 1.0)
    stuck = ForkTemplate(child_env(), tmp_path / "log-template.txt")
    try:
        assert stuck.wait_ready(IMPORT_BOUND_S), stuck.failed
        os.kill(stuck._proc.pid, signal.SIGSTOP)
        ended = run_isolated(python_command("graphdoctor.child", str(_spec(tmp_path, "stuck"))),
                             timeout_s=IMPORT_BOUND_S, log_path=tmp_path / "log.txt", env=child_env(), template=stuck)
        assert stuck.failed is not None and "did not fork" in stuck.failed
        assert stuck._proc.poll() is not None
        assert ended.returncode == 3
        kinds = [type(e).__name__ for e in read_events(str(tmp_path / "events-stuck.jsonl")).events]
        assert kinds[0] == "Started" and kinds[-1] == "Error", kinds
    finally:
        stuck.close()


def test_a_cancelled_child_never_starts_while_the_template_imports(tmp_path: Path) -> None:
    slow = ForkTemplate(child_env(), tmp_path / "log-template.txt")
    cancel = threading.Event()
    cancel.set()
    ended = run_isolated(python_command("graphdoctor.child", str(_spec(tmp_path, "cancelled"))), timeout_s=60.0,
                         log_path=tmp_path / "log.txt", env=child_env(), template=slow, cancel=cancel)
    slow.close()
    assert ended.stopped == "cancelled" and ended.returncode is None
    assert not (tmp_path / "events-cancelled.jsonl").exists()


def test_another_environment_or_command_is_not_forked(template: ForkTemplate) -> None:
    argv = python_command("graphdoctor.child", "spec.json")
    assert not template.serves(argv, {**child_env(), "NCCL_DEBUG": "INFO"})
    assert template.serves(argv, {**child_env(), "CUDA_VISIBLE_DEVICES": "3"})
    assert not template.serves(python_command("graphdoctor.child.skeleton", "a", "b"), child_env())
    assert template.imported_env.get("TORCHINDUCTOR_CACHE_DIR")  # torch's import sets it, here as in the parent
    assert template.serves(argv, {**child_env(), "TORCHINDUCTOR_CACHE_DIR": template.imported_env["TORCHINDUCTOR_CACHE_DIR"]})


def test_a_variable_the_imports_set_does_not_stop_the_fork() -> None:
    """The parent's own imports of torch and Megatron set TORCHINDUCTOR_CACHE_DIR after the template started (the
    template's imports set it too): later children are still forked. A value neither had is not."""
    launched = {"PATH": "/bin", "A": "1"}
    imported = {**launched, "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_root", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    assert same_imports(launched, launched, imported)
    assert same_imports({**launched, "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_root"}, launched, imported)
    assert same_imports({**launched, "CUDA_VISIBLE_DEVICES": "2", "GRAPHDOCTOR_CHILD_TOKEN": "t"}, launched, imported)
    assert not same_imports({**launched, "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}, launched, imported)
    assert not same_imports({**launched, "A": "2"}, launched, imported)
    assert not same_imports({"PATH": "/bin"}, launched, imported)


def test_the_switch_turns_the_template_off() -> None:
    assert enabled({}) and enabled({SWITCH_ENV: "1"}) and not enabled({SWITCH_ENV: "0"})
    assert os.environ.get(SWITCH_ENV, "1") != "0" or not enabled()


def test_an_early_template_is_adopted_by_a_session_of_its_environment(tmp_path: Path) -> None:
    """start_early before the command knows its children; the session adopts it: its log is linked to the
    session's log-template.txt and it forks the session's children."""
    assert parent_template.start_early(child_env())
    assert not parent_template.start_early(child_env())  # one per process
    try:
        adopted = parent_template.adopt_early({}, tmp_path / "log-template.txt")
        assert adopted is not None and adopted.log_path == tmp_path / "log-template.txt"
        assert parent_template.adopt_early({}, tmp_path / "again.txt") is None  # adopted once
        assert adopted.wait_ready(IMPORT_BOUND_S), (adopted.failed, (tmp_path / "log-template.txt").read_text())
        ended = run_isolated(python_command("graphdoctor.child", str(_spec(tmp_path, "early"))),
                             timeout_s=IMPORT_BOUND_S, log_path=tmp_path / "log.txt", env=child_env(), template=adopted)
        assert ended.returncode == 3 and adopted.failed is None
        with adopted._cond:
            assert len(adopted._pids) == 1  # forked, not started as its own interpreter
    finally:
        adopted.close()
    assert adopted._proc.poll() is not None


def test_an_early_template_of_another_environment_is_closed(tmp_path: Path) -> None:
    """A session whose run file or launch script sets a variable the early template was started without does not
    adopt it: the template is ended and its temporary log removed. One never adopted is ended at close_early."""
    assert parent_template.start_early(child_env())
    early = parent_template._early
    assert early is not None
    assert parent_template.adopt_early({"NCCL_DEBUG": "INFO"}, tmp_path / "log-template.txt") is None
    assert early._proc.poll() is not None and not early.log_path.exists()
    assert not (tmp_path / "log-template.txt").exists()
    assert parent_template.start_early(child_env())
    unused = parent_template._early
    assert unused is not None
    parent_template.close_early()
    assert unused._proc.poll() is not None and not unused.log_path.exists() and parent_template._early is None


def test_the_imports_are_frozen_out_of_later_collections() -> None:
    """preload imports with the collector off, then freezes what the imports made: the collector is on again,
    tens of thousands of objects are out of its reach, and garbage made afterwards is still collected. A block
    inside one that turned the collector off leaves it off (graphdoctor.collector.imports_frozen); the parent's
    pause (collector_paused) freezes nothing."""
    import subprocess
    import sys

    code = ("import gc\n"
            "from graphdoctor.collector import collector_paused, imports_frozen\n"
            "before = gc.get_freeze_count()\n"
            "with collector_paused():\n"
            "    assert not gc.isenabled()\n"
            "assert gc.isenabled() and gc.get_freeze_count() == before\n"
            "with imports_frozen():\n"
            "    with imports_frozen():\n"
            "        pass\n"
            "    assert not gc.isenabled()\n"
            "from graphdoctor.child.entry import preload\n"
            "preload()\n"
            "a = []; a.append(a); del a\n"
            "print(gc.isenabled(), gc.get_freeze_count(), gc.collect())")
    proc = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=240,
                          check=False, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    enabled_after, frozen, collected = proc.stdout.split()
    assert enabled_after == "True"
    assert int(frozen) > 50_000
    assert int(collected) >= 1
