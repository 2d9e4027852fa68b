"""Hangs and hung exits from the parent's side: the stacks a timed-out child's processes dumped
(faulthandler text), each rank's phase and last step from its events, the verdict `hang` or `timeout`,
and the teardown of a finished run (graphdoctor.child.stacks writes the stacks).

Pure Python over text and events, so it is tested on CPU with real dumps of real processes.
"""

from __future__ import annotations

import dataclasses
import linecache
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from graphdoctor.locations import short_path
from graphdoctor.parent.diagnose import is_user_frame
from graphdoctor.protocol.events import End, EventLog, Phase, Started, Step, Teardown
from graphdoctor.rules import rule_fix
from graphdoctor.types import MAX_STACK_FRAMES, Diagnosis, RankExit, RankStack

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')

COLLECTIVE_FILES = ("torch/distributed/",)
"""Where a Python frame waiting in a collective (gloo wait, NCCL barrier, destroy) lives."""

SYNC_LINE = re.compile(r"\.(item|tolist|cpu|synchronize)\(")
"""A source line that waits for the device (an implicit or explicit CUDA synchronize)."""

HANG_RULE = "GD517"
"""Catalogue rule of a `hang`: ranks waiting in collectives the others never issue (checks/gd5xx_schedule.py)."""



@dataclass(frozen=True, slots=True)
class Thread:
    """One thread of a faulthandler dump."""

    ident: str
    current: bool
    frames: tuple[tuple[str, int, str], ...]
    """(file, line, function), innermost first, as faulthandler writes them."""


def parse_dump(text: str) -> list[Thread]:
    """The threads of the last dump in `text` (a file may hold several: a thread id seen twice
    starts a new dump)."""
    threads: list[Thread] = []
    ident: str | None = None
    current = False
    frames: list[tuple[str, int, str]] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            if ident is not None:
                threads.append(Thread(ident, current, tuple(frames)))
            ident, current, frames = head.group(2), head.group(1) == "Current thread", []
            if any(t.ident == ident for t in threads):
                threads = []
            continue
        frame = _FRAME.match(line)
        if frame and ident is not None:
            frames.append((frame.group(1), int(frame.group(2)), frame.group(3)))
    if ident is not None:
        threads.append(Thread(ident, current, tuple(frames)))
    return threads


def main_thread(threads: Sequence[Thread]) -> Thread | None:
    """The thread running the program: not started by threading (its outermost frame is not
    threading's _bootstrap); the current thread when that is ambiguous."""
    mains = [t for t in threads if t.frames and not t.frames[-1][0].endswith("threading.py")]
    for thread in mains:
        if any("runpy" in f or f.endswith("__main__.py") for f, _, _ in thread.frames[-3:]):
            return thread
    return next(iter(mains), next((t for t in threads if t.current), None))


def waiting_in(frames: Sequence[tuple[str, int, str]]) -> str | None:
    """`all_reduce (torch/distributed/distributed_c10d.py:2950)` when the innermost frames wait in a
    collective, `synchronize (...)` or `host sync `x.item()` (...)` when they wait for the device."""
    if not frames:
        return None
    for file, line, func in frames[:3]:
        if any(marker in file.replace("\\", "/") for marker in COLLECTIVE_FILES) and func != "wrapper":
            return f"{func} ({short_path(file)}:{line})"
    file, line, func = frames[0]
    if func == "synchronize" and "torch/cuda" in file.replace("\\", "/"):
        return f"CUDA synchronize ({short_path(file)}:{line})"
    source = linecache.getline(file, line).strip()
    if SYNC_LINE.search(source):
        return f"host sync `{source[:80]}` ({short_path(file)}:{line})"
    return None


def _user_frame(frames: Sequence[tuple[str, int, str]]) -> str | None:
    for file, line, func in frames:
        if is_user_frame(file) or "/megatron/" in file.replace("\\", "/"):
            return f"{short_path(file)}:{line} in {func}"
    return None


def rank_stack(label: str, text: str, log: EventLog | None) -> RankStack:
    """One process's stack from its dump, with its phase and last finished step from its events."""
    threads = parse_dump(text)
    main = main_thread(threads)
    frames = main.frames if main is not None else ()
    phase, last_step = phase_and_step(log) if log is not None else (None, -1)
    return RankStack(label=label, frames=tuple(f"{short_path(f)}:{n} in {fn}" for f, n, fn in
                                               frames[:MAX_STACK_FRAMES]),
                     phase=phase, last_step=last_step,
                     waiting_in=waiting_in(frames) if _rank_of(label) is not None else None,
                     user_frame=_user_frame(frames), num_threads=len(threads))


def phase_and_step(log: EventLog) -> tuple[str | None, int]:
    """The last phase a rank entered (Phase events; `setup` once started) and its last finished step."""
    phases = log.of(Phase)
    steps = log.of(Step)
    phase = phases[-1].phase if phases else ("setup" if log.first(Started) is not None else None)
    return phase, steps[-1].record.step if steps else -1


def _rank_of(label: str) -> int | None:
    return int(label[4:]) if label.startswith("rank") and label[4:].isdigit() else None


def timeout_outcome(timeout_s: float, logs: Mapping[int, EventLog], stacks: Sequence[tuple[str, str]],
                    group_gone: bool | None = None,
                    left_running: Sequence[str] = ()) -> tuple[str, Diagnosis]:
    """`hang` (a rank waits in a collective or a CUDA synchronize) or `timeout`, with every rank's
    phase, last finished step and stack (ranks by number, then the launcher).

    Args:
        timeout_s: the limit that ran out.
        logs: each rank's events.
        stacks: (label, dump text) of every process that dumped its stacks.
        group_gone: whether the runner found no process of the group left (None: not checked).
        left_running: the processes it found still running.
    """
    gone = {True: "no process left", False: f"{len(left_running)} process(es) left running: "
            + "; ".join(left_running), None: ""}[group_gone]
    diag, waiting = _ended_outside(f"no result within {timeout_s:.0f} s; killed", logs, stacks, gone)
    if waiting:
        return "hang", dataclasses.replace(diag, error_type="hang", rule=HANG_RULE, fix=rule_fix(HANG_RULE))
    return "timeout", diag


def stopped_outcome(signal_name: str, logs: Mapping[int, EventLog],
                    stacks: Sequence[tuple[str, str]]) -> tuple[str, Diagnosis]:
    """`stopped`: the parent got `signal_name` and ended this child before its result, with every rank's
    phase, last finished step and stack at that moment (as timeout_outcome gives them)."""
    diag, _ = _ended_outside(f"stopped by {signal_name} with graphdoctor before its result", logs, stacks, "")
    return "stopped", dataclasses.replace(diag, error_type="stopped")


def _ended_outside(why: str, logs: Mapping[int, EventLog], stacks: Sequence[tuple[str, str]],
                   gone: str) -> tuple[Diagnosis, bool]:
    """The diagnosis of a child ended from outside (`timeout` as its error type), and whether a rank
    waited in a collective or a CUDA synchronize."""
    dumped = dict(stacks)
    labels = sorted({f"rank{r}" for r in logs} | {k for k in dumped if _rank_of(k) is not None},
                    key=lambda k: _rank_of(k) or 0) + [k for k in dumped if _rank_of(k) is None]
    ranks = tuple(rank_stack(k, dumped.get(k, ""), logs.get(_rank_of(k) or 0) if _rank_of(k) is not None
                             else None) for k in labels)
    waiting = [r for r in ranks if r.waiting_in is not None and _rank_of(r.label) is not None]
    parts = [_rank_words(r) for r in ranks if _rank_of(r.label) is not None]
    message = f"{why}; " + "; ".join(p for p in (*parts, gone) if p)
    first = waiting[0] if waiting else (ranks[0] if ranks else None)
    steps = [r.last_step for r in ranks if _rank_of(r.label) is not None]
    diag = Diagnosis(error_type="timeout", message=message,
                     step=(min(steps) + 1) if steps else None, phase=first.phase if first else None,
                     location=first.user_frame.split(" in ")[0] if first and first.user_frame else None,
                     traceback_tail=list(first.frames[:8]) if first else [], stacks=ranks)
    return diag, bool(waiting)


def _rank_words(stack: RankStack) -> str:
    where = f" waiting in {stack.waiting_in}" if stack.waiting_in else ""
    if not stack.frames:
        where = " (no stack)"
    after = f"after step {stack.last_step}" if stack.last_step >= 0 else "before any step"
    return f"{stack.label} in {stack.phase or 'startup'} {after}{where}"


def teardown_exits(logs: Mapping[int, EventLog], stacks: Sequence[tuple[str, str]],
                   backstop_mark: str = "Timeout (") -> tuple[RankExit, ...]:
    """How each rank that wrote its end event exited: its Teardown event; a rank with an end event,
    no Teardown event and a dump by faulthandler's backstop (`backstop_mark`) hung too."""
    dumped = dict(stacks)
    exits = []
    for rank, log in sorted(logs.items()):
        if log.first(End) is None:
            continue
        text = dumped.get(f"rank{rank}", "")
        event: Teardown | None = log.first(Teardown)
        if event is not None:
            stack = rank_stack(f"rank{rank}", text, log) if event.hung and text else None
            exits.append(RankExit(rank=rank, teardown_s=event.seconds,
                                  since_last_step_s=event.since_last_step_s, hung=event.hung, stack=stack,
                                  graphs_released=event.graphs_released, graphs_alive=event.graphs_alive))
        elif backstop_mark in text:
            exits.append(RankExit(rank=rank, teardown_s=-1.0, since_last_step_s=-1.0, hung=True,
                                  stack=rank_stack(f"rank{rank}", text, log)))
    return tuple(exits)


__all__ = ["HANG_RULE", "Thread", "main_thread", "parse_dump", "phase_and_step", "rank_stack",
           "teardown_exits", "stopped_outcome", "timeout_outcome", "waiting_in"]
