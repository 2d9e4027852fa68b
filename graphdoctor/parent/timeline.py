"""What a diff cost, from its children's seconds (graphdoctor.protocol.seconds): the parent's own seconds
before its first child started and after its last one ended, and what each observer cost a child."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.seconds import STAGE_NAMES
from graphdoctor.strict_json import nullable


def process_started_at() -> float:
    """time.time() when this process started (Linux: /proc/self/stat and the boot time); the import of this
    module where /proc cannot say."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat(5): starttime, clock ticks after boot
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])  # /proc/stat's btime is whole seconds: too coarse
        return _now() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


def _now() -> float:
    import time

    return time.time()


_IMPORTED_AT = _now()


@dataclass(frozen=True, slots=True)
class Timeline:
    """When the command started and finished, and its first and last child (time.time() values)."""

    started_at: float
    """The command's process started."""
    finished_at: float
    """The report was complete (before it was written)."""
    first_child_at: float | None = None
    last_child_at: float | None = None
    children: int = 0
    template_started_at: float | None = None
    """The template the children were forked from was asked for (graphdoctor.parent.template); None without one."""
    template_ready_at: float | None = None
    """It had imported torch, Megatron and graphdoctor's child modules; None without one, or one never ready."""
    retried: tuple[tuple[str, str], ...] = ()
    """(child, cause) for each child the machine failed once and that ran again alone
    (graphdoctor.parent.environment); the child is its first attempt's name."""

    @property
    def template_after_s(self) -> float | None:
        """The command's own seconds before it asked for the template."""
        return None if self.template_started_at is None else max(0.0, self.template_started_at - self.started_at)

    @property
    def template_imports_s(self) -> float | None:
        """The template's seconds from being asked for to ready: a child's start-up, less the fork."""
        if self.template_started_at is None or self.template_ready_at is None:
            return None
        return max(0.0, self.template_ready_at - self.template_started_at)

    @property
    def before_first_child_s(self) -> float | None:
        """The parent's own seconds before its first child started."""
        return None if self.first_child_at is None else max(0.0, self.first_child_at - self.started_at)

    @property
    def after_last_child_s(self) -> float | None:
        """The parent's own seconds after its last child ended, to the complete report."""
        return None if self.last_child_at is None else max(0.0, self.finished_at - self.last_child_at)

    def to_dict(self) -> dict[str, Any]:
        """JSON view (docs/diff.md)."""
        return {"started_at": self.started_at, "finished_at": self.finished_at,
                "first_child_at": self.first_child_at, "last_child_at": self.last_child_at,
                "children": self.children, "before_first_child_s": self.before_first_child_s,
                "after_last_child_s": self.after_last_child_s, "template_started_at": self.template_started_at,
                "template_ready_at": self.template_ready_at, "template_after_s": self.template_after_s,
                "template_imports_s": self.template_imports_s,
                "retried": [{"child": child, "cause": cause} for child, cause in self.retried]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timeline:
        """Inverse of to_dict."""
        return cls(started_at=float(data.get("started_at", 0.0)), finished_at=float(data.get("finished_at", 0.0)),
                   first_child_at=nullable(float, data.get("first_child_at")),
                   last_child_at=nullable(float, data.get("last_child_at")),
                   children=int(data.get("children", 0)),
                   template_started_at=nullable(float, data.get("template_started_at")),
                   template_ready_at=nullable(float, data.get("template_ready_at")),
                   retried=tuple((str(r.get("child", "")), str(r.get("cause", "")))
                                 for r in data.get("retried") or () if isinstance(r, dict)))


def unique_runs(runs: Iterable[RunRecord | None]) -> list[RunRecord]:
    """Each child once (a report lists the eager reference on every row), by name; records without one kept."""
    seen: set[str] = set()
    out = []
    for run in runs:
        if run is None or (run.name and run.name in seen):
            continue
        seen.add(run.name)
        out.append(run)
    return out


def timeline_of(runs: Iterable[RunRecord], started_at: float, finished_at: float,
                template: tuple[float, float | None] | None = None,
                retried: Iterable[tuple[str, str]] = (), processes: Iterable[RunRecord] = ()) -> Timeline:
    """The timeline of a command whose children are `runs`; `template`: when the template they were forked from
    was asked for and when it was ready (time.time() values), where there was one; `retried`: (child, cause) of
    each child that ran again alone after the machine failed it; `processes`: the records of every child process
    the command ran, the first attempts of retried children too (not in `runs`): they count for its first and
    last child."""
    runs = list(runs)
    spans = [r.seconds for r in runs if r.seconds is not None and r.seconds.started_at]
    every = spans + [r.seconds for r in processes if r.seconds is not None and r.seconds.started_at]
    return Timeline(started_at=started_at, finished_at=finished_at,
                    first_child_at=min((s.started_at for s in every), default=None),
                    last_child_at=max((s.ended_at for s in every), default=None), children=len(spans),
                    template_started_at=None if template is None else template[0],
                    template_ready_at=None if template is None else template[1], retried=tuple(retried))


@dataclass(frozen=True, slots=True)
class ObserverCost:
    """One observer over the children that had it."""

    name: str
    children: int
    mean_s: float
    """Its seconds per child."""
    share: float
    """Its seconds over those children's wall seconds."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"name": self.name, "children": self.children, "mean_s": self.mean_s, "share": self.share}


def observer_costs(runs: Iterable[RunRecord]) -> list[ObserverCost]:
    """Each observer's seconds per child and its share of those children's wall time, costliest first."""
    spent: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        if run.seconds is None:
            continue
        for name, seconds in run.seconds.observers.items():
            spent.setdefault(name, []).append((seconds, run.wall_s))
    costs = [ObserverCost(name=name, children=len(pairs), mean_s=sum(s for s, _ in pairs) / len(pairs),
                          share=sum(s for s, _ in pairs) / max(1e-9, sum(w for _, w in pairs)))
             for name, pairs in spent.items()]
    return sorted(costs, key=lambda c: -c.mean_s)


def stage_costs(runs: Iterable[RunRecord]) -> dict[str, float]:
    """Each start-up and set-up stage's mean seconds over the children that timed it, in STAGE_NAMES order (a
    stage this version does not name last)."""
    spent: dict[str, list[float]] = {}
    for run in runs:
        for name, seconds in (run.seconds.stages if run.seconds is not None else {}).items():
            spent.setdefault(name, []).append(seconds)
    order = [*STAGE_NAMES, *sorted(set(spent) - set(STAGE_NAMES))]
    return {name: sum(spent[name]) / len(spent[name]) for name in order if name in spent}


def retried_words(retried: Iterable[tuple[str, str]]) -> str:
    """`6 ran again alone after the machine failed them (out of memory while other children of this run shared the
    GPU)`: how many children were retried, with each cause's short form and its count where causes differ."""
    causes = Counter(cause.split(" (")[0].split(";")[0] for _, cause in retried)
    total = sum(causes.values())
    said = ", ".join(cause if len(causes) == 1 else f"{cause}: {n}" for cause, n in causes.most_common())
    return f"{total} ran again alone after the machine failed {'them' if total > 1 else 'it'} ({said})"


def cost_line(timeline: Timeline | None, runs: list[RunRecord], jobs: str) -> str:
    """One line: children and how they ran, the parent's own seconds, where a child's start-up and set-up went,
    what each observer cost a child."""
    parts = [f"{len(runs)} children ({jobs})" if jobs else f"{len(runs)} children"]
    if timeline is not None and timeline.retried:
        parts.append(retried_words(timeline.retried))
    if timeline is not None and timeline.before_first_child_s is not None:
        parts.append(f"parent {timeline.before_first_child_s:.1f} s before the first, "
                     f"{timeline.after_last_child_s or 0.0:.1f} s after the last")
    if timeline is not None and timeline.template_imports_s is not None:
        parts.append(f"template asked for {timeline.template_after_s or 0.0:.1f} s into the command, "
                     f"ready {timeline.template_imports_s:.1f} s later")
    stages = {name: s for name, s in stage_costs(runs).items() if s >= 0.05}
    if stages:
        parts.append("start-up and set-up per child: " + ", ".join(f"{n} {s:.1f} s" for n, s in stages.items()))
    costs = [c for c in observer_costs(runs) if c.mean_s >= 0.05]
    if costs:
        parts.append("observers per child: " + ", ".join(
            f"{c.name} {c.mean_s:.1f} s ({100 * c.share:.0f} %)" for c in costs))
    return "cost: " + "; ".join(parts)


__all__ = ["ObserverCost", "Timeline", "cost_line", "observer_costs", "process_started_at", "retried_words",
           "stage_costs", "timeline_of", "unique_runs"]
