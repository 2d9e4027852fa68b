"""The run schedule in the reports: the phases each run went through (checkpoint and resume included)
and every evaluation's loss, eager beside each graphed implementation (terminal lines and the HTML
page's eval section).
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any

from graphdoctor.compare.phases import phases_summary
from graphdoctor.config.impl import Impl
from graphdoctor.report.html_page import table

if TYPE_CHECKING:
    from graphdoctor.diff.report import DiffReport
    from graphdoctor.report.html_model import ReportView


def _fmt(value: float | None) -> str:
    return "-" if value is None else format(value, ".6g")


def phase_lines(report: DiffReport) -> list[str]:
    """`phases` line per run (steps per phase, evaluations, first replays after one, the checkpoint and
    the resume), then one line per evaluation with eager's loss and each implementation's (`=` where bitwise equal)."""
    runs = [(Impl.EAGER, report.reference)] + [(r.impl, r.runs[0]) for r in report.results if r.runs]
    lines = []
    for name, run in runs:
        summary = phases_summary(run)
        steps = ", ".join(f"{phase} {count}" for phase, count in summary["steps"].items())
        evals = f"; eval {summary['evals']} ({summary['steps_after_eval']} training steps right after one)" \
            if summary["evals"] else ""
        lines.append(f"  phases {name}: {steps}{evals}{_checkpoint_text(summary)}")
    for ref in report.reference.evals:
        cells = []
        for name, run in runs[1:]:
            mine = next((e for e in run.evals if e.index == ref.index), None)
            mark = "" if mine is None else (" =" if mine.loss == ref.loss else " !=")
            cells.append(f"{name} {_fmt(None if mine is None else mine.loss)}{mark}")
        which = "final eval" if ref.final else f"eval {ref.index}"
        lines.append(f"  {which} after step {ref.after_step}: eager {_fmt(ref.loss)}"
                     + "".join(f" | {c}" for c in cells))
    return lines


def _checkpoint_text(summary: dict[str, Any]) -> str:
    """`; checkpoint after step 3 (0.41 s); resume at step 4 (load 0.30 s; capture 1, replay 2 in the new
    process)` from phases_summary, or "" without a checkpoint."""
    parts = []
    for action, iteration, seconds in summary["checkpoints"]:
        if action == "save":
            parts.append(f"checkpoint after step {iteration - 1} ({seconds:.2f} s)")
        else:
            steps = ", ".join(f"{phase} {count}" for phase, count in summary["steps_after_resume"].items())
            parts.append(f"resume at step {iteration} (load {seconds:.2f} s; {steps or 'no steps'} in the new process)")
    return "".join(f"; {part}" for part in parts)


def eval_section(view: ReportView) -> str:
    """The page's `eval` section: one row per evaluation, eager's loss and each implementation's, or
    "" when no run evaluated."""
    ref = view.reference
    if ref is None or not ref.evals:
        return ""
    graphed = view.graphed_runs()
    rows: list[list[object]] = []
    for e in ref.evals:
        row: list[object] = ["final" if e.final else str(e.index), str(e.after_step), "eval", _fmt(e.loss)]
        for _, run in graphed:
            mine = next((x for x in run.evals if x.index == e.index), None) if run is not None else None
            same = mine is not None and mine.loss == e.loss
            row.append(f"{_fmt(None if mine is None else mine.loss)}{' (=)' if same else ' (differs)'}")
        rows.append(row)
    headers = ["eval", "after step", "phase", "eager loss", *[f"{name} loss" for name, _ in graphed]]
    body = table(headers, rows, numeric=range(3, 4 + len(graphed)))
    return (f'<section id="eval"><h2>Evaluations</h2><p class="muted">{escape("forward-only, eval mode, no grad")}'
            f"</p>{body}</section>")


__all__ = ["eval_section", "phase_lines"]
