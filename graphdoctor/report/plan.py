"""Render the plans: what `advise --plan` and `diff --plan` would run, each row screened without a GPU
(graphdoctor.advise_candidates.screen: availability, Megatron's TransformerConfig validation, the rule catalogue)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tabulate import tabulate

from graphdoctor.report.escape import escape_control

if TYPE_CHECKING:
    from graphdoctor.advise_candidates import Rejection, Screening
    from graphdoctor.config import DiffConfig

_WHY_WIDTH = 60


def _short(text: str, width: int = _WHY_WIDTH) -> str:
    text = escape_control(" ".join(text.split()))
    return text if len(text) <= width else text[:width - 3] + "..."


def _row(item: Screening, errors: tuple[Rejection, ...], status: str) -> list[str]:
    """[label, plan, why]: `status` with the first of `errors`, else `unavailable`, else `run` with the warnings."""
    if errors:
        head, *others = errors
        why = _short(f"{head.rule} {head.message}") + (f" (also {', '.join(r.rule for r in others)})" if others else "")
        return [escape_control(item.candidate.label), status, escape_control(why)]
    if item.unavailable is not None:
        return [escape_control(item.candidate.label), "unavailable", escape_control(_short(item.unavailable))]
    codes = [w.split(" ", 1)[0] for w in item.warnings]
    return [escape_control(item.candidate.label), "run", f"warnings {', '.join(codes)}" if codes else ""]


def plan_table(screenings: list[Screening]) -> str:
    """advise's candidates: `run`, `rejected` with its rules (errors, GD219 and Megatron's validation), or
    `unavailable` with the reason."""
    rows = [_row(item, item.rejections, "rejected") for item in screenings]
    return tabulate(rows, headers=["candidate", "plan", "why"], tablefmt="simple")


def diff_errors(item: Screening) -> tuple[Rejection, ...]:
    """What makes one of diff's rows fail its check: error-level findings and Megatron's validation. advise's
    other reasons not to run a candidate (NOT_RUN_RULES: GD219, a scope that graphs what another candidate does)
    are warnings here: diff runs what it is asked."""
    from graphdoctor.advise_candidates import NOT_RUN_RULES

    return tuple(r for r in item.rejections if r.rule not in NOT_RUN_RULES)


def _diff_row(item: Screening) -> list[str]:
    errors = diff_errors(item)
    if errors or item.unavailable is not None:
        return _row(item, errors, "error")
    warned = [r.rule for r in item.rejections] + [w.split(" ", 1)[0] for w in item.warnings]
    return [escape_control(item.candidate.label), "run", f"warnings {', '.join(warned)}" if warned else ""]


def render_diff_plan(config: DiffConfig, screenings: list[Screening]) -> str:
    """`diff --plan`: the run as diff would read it (the header of its summary), one row per implementation, and
    which children it would start. A row with an error-level finding still runs in diff (`check` says why it is
    expected to fail or to differ); an unavailable one is reported as such, as diff reports it."""
    from graphdoctor.report.diff import header_line, placement_line

    lines = [header_line(config, "graphdoctor diff --plan")]
    if config.nproc_per_node > 1:
        lines.append(placement_line(config))
    table = tabulate([_diff_row(item) for item in screenings], headers=["implementation", "plan", "why"],
                     tablefmt="simple")
    lines += ["", table, ""]
    running = [item.candidate.impl for item in screenings if item.unavailable is None]
    children = f"the eager reference and {len(running)} graphed run{'s' if len(running) != 1 else ''}"
    if config.dropout > 0 and running:
        children += f"; a row that differs at dropout {config.dropout:g} also runs a dropout-0 control pair"
    if config.eval_interval or config.save_at:
        children += "; each with the run schedule (evaluation, checkpoint and resume)"
    errors = sum(1 for item in screenings if diff_errors(item))
    lines.append(f"would start {children}; {errors} with error-level findings; nothing ran (no GPU needed)")
    return "\n".join(lines)


__all__ = ["diff_errors", "plan_table", "render_diff_plan"]
