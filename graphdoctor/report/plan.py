"""Render the plans: what `advise --plan` and `diff --plan` would run, each row screened without a GPU
(graphdoctor.advise.candidates.screen: availability, Megatron's TransformerConfig validation, the rule catalogue),
as a table and as the `plan` JSON document (docs/json.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from graphdoctor.advise.plan import PlanOf
from graphdoctor.envelope import envelope
from graphdoctor.report.escape import escape_control, one_line

if TYPE_CHECKING:
    from graphdoctor.advise.candidates import Rejection, Screening
    from graphdoctor.advise.plan import Plan
    from graphdoctor.config import DiffConfig

_WHY_WIDTH = 60


def _short(text: str, width: int = _WHY_WIDTH) -> str:
    return one_line(text, width)


def diff_errors(item: Screening) -> tuple[Rejection, ...]:
    """What makes one of diff's rows fail its check: error-level findings and Megatron's validation. advise's
    other reasons not to run a candidate (NOT_RUN_RULES: GD219, a scope that graphs what another candidate does)
    are warnings here: diff runs what it is asked."""
    from graphdoctor.advise.candidates import NOT_RUN_RULES

    return tuple(r for r in item.rejections if r.rule not in NOT_RUN_RULES)


def row_plan(item: Screening, of: PlanOf) -> tuple[str, tuple[Rejection, ...], tuple[str, ...]]:
    """(plan, the rejections that decide it, the warning codes) of one row: diff's `run`/`error`/`unavailable`,
    advise's `run`/`rejected`/`unavailable`."""
    errors = diff_errors(item) if of == "diff" else item.rejections
    warnings = tuple(r.rule for r in item.rejections if r not in errors) + tuple(
        w.split(" ", 1)[0] for w in item.warnings)
    if errors:
        return ("error" if of == "diff" else "rejected"), errors, warnings
    return ("unavailable" if item.unavailable is not None else "run"), (), warnings


def _row(item: Screening, of: PlanOf) -> list[str]:
    """[label, plan, why]: the first deciding rejection, the reason it is unavailable, or the warnings."""
    plan, errors, warnings = row_plan(item, of)
    if errors:
        head, *others = errors
        why = _short(f"{head.rule} {head.message}") + (f" (also {', '.join(r.rule for r in others)})" if others else "")
    elif plan == "unavailable":
        why = _short(item.unavailable or "")
    else:
        why = f"warnings {', '.join(warnings)}" if warnings else ""
    return [escape_control(item.candidate.label), plan, escape_control(why)]


def plan_table(screenings: list[Screening], of: PlanOf) -> str:
    """One row per screened configuration (diff: its implementations; advise: its candidates)."""
    first = "implementation" if of == "diff" else "candidate"
    return tabulate([_row(item, of) for item in screenings], headers=[first, "plan", "why"], tablefmt="simple")


def plan_exit_code(screenings: list[Screening], of: PlanOf) -> int:
    """diff: 1 when a row has error-level findings; advise: 1 when no candidate would run; else 0."""
    if of == "diff":
        return 1 if any(diff_errors(item) for item in screenings) else 0
    return 0 if any(item.runnable for item in screenings) else 1


def render_diff_plan(config: DiffConfig, screenings: list[Screening], *, model_lines: tuple[str, ...] = (),
                     refusals: list[str] | None = None) -> str:
    """`diff --plan`: the run as diff would read it (the header of its summary), one row per implementation, and
    which children it would start. A row with an error-level finding still runs in diff (`check` says why it is
    expected to fail or to differ), except one Megatron cannot build (SETUP_RULES: setup-failed without a child); an
    unavailable one is reported as such, as diff reports it."""
    from graphdoctor.report.diff import header_line, placement_line

    lines = [header_line(config, "graphdoctor diff --plan"), *model_lines]
    needs = _recipe_needs(config)
    if needs:
        lines.append(f"  precision: {needs}")
    if config.nproc_per_node > 1:
        lines.append(placement_line(config))
    lines += ["", plan_table(screenings, "diff"), ""]
    from graphdoctor.parent.static import SETUP_RULES

    never = [item for item in screenings if any(r.rule in SETUP_RULES for r in item.rejections)]
    running = [item.candidate.impl for item in screenings if item.unavailable is None and item not in never]
    children = f"the eager reference and {len(running)} graphed run{'s' if len(running) != 1 else ''}"
    if never:
        children += (f" ({', '.join(item.candidate.label for item in never)}: setup-failed from the catalogue, "
                     "never started)")
    if config.dropout > 0 and running:
        children += f"; a row that differs at dropout {config.dropout:g} also runs a dropout-0 control pair"
    if config.eval_interval or config.save_at:
        children += "; each with the run schedule (evaluation, checkpoint and resume)"
    errors = sum(1 for item in screenings if diff_errors(item))
    lines.append(f"would start {children}; {errors} with error-level findings; nothing ran (no GPU needed)")
    lines += refusal_lines(list(refusals or []))
    return "\n".join(lines)


def plan_document(of: PlanOf, config: DiffConfig, screenings: list[Screening], *, model: dict[str, Any] | None = None,
                  skeleton: dict[str, Any] | None = None, refusals: list[str] | None = None) -> dict[str, Any]:
    """The `plan` JSON document: `of` (`diff` or `advise`), the config as read, the model as it would be built
    (`model`: its facts; `skeleton`: what building it on the meta device said), one row per screened
    configuration (`candidate`, `plan`, `rejections`, `unavailable`, `warnings`), which GPU the FP8 or FP4 recipe
    needs (`recipe_needs`, null without one), every reason the run would be refused here (`refusals`, each with its
    fix) and the exit code (1 with a refusal)."""
    refusals = list(refusals or [])
    rows = []
    for item in screenings:
        plan, errors, warnings = row_plan(item, of)
        rows.append({"candidate": item.candidate.to_dict(), "plan": plan,
                     "rejections": [r.to_dict() for r in errors], "unavailable": item.unavailable,
                     "warnings": list(warnings)})
    return envelope("plan", {"of": of, "config": config.to_dict(), "model": model, "skeleton": skeleton, "rows": rows,
                             "recipe_needs": _recipe_needs(config), "refusals": refusals,
                             "exit_code": 1 if refusals else plan_exit_code(screenings, of)})


def refusal_lines(refusals: list[str]) -> list[str]:
    """The plan's block of what diff would refuse here before any GPU work, each with its fix (none: no lines)."""
    if not refusals:
        return []
    return ["", f"refused here ({len(refusals)}; diff would stop before any GPU work):",
            *(f"  - {why}" for why in refusals)]


def _recipe_needs(config: DiffConfig) -> str | None:
    """Which GPU the run's FP8 or FP4 recipe needs (graphdoctor.config.fp8.recipe_needs), None without one."""
    from graphdoctor.config.fp8 import recipe_needs

    return recipe_needs(config.model.value)


def plan_text(plan: Plan) -> str:
    """What `--plan` prints: the header and model lines, the table, the refusals."""
    from graphdoctor.report.diff import model_line

    model_lines = (model_line(plan.facts, plan.skeleton.num_parameters), f"  {plan.skeleton.line}")
    if plan.of == "diff":
        return render_diff_plan(plan.config, plan.screenings, model_lines=model_lines, refusals=plan.refusals)
    return "\n".join((*model_lines, render_advise_plan(plan.screenings), *refusal_lines(plan.refusals)))


def render_advise_plan(screenings: list[Screening]) -> str:
    """`advise --plan`'s table: one row per candidate, `run`, `rejected` with its rules or `unavailable`."""
    runnable = sum(1 for item in screenings if item.runnable)
    return (f"{plan_table(screenings, 'advise')}\n{runnable} of {len(screenings)} candidates would run (plus eager "
            "once); nothing ran")


def plan_json(plan: Plan) -> str:
    """The `plan` JSON document (docs/json.md)."""
    import json

    return json.dumps(plan_document(plan.of, plan.config, plan.screenings, model=plan.facts,
                                    skeleton=plan.skeleton_dict(), refusals=plan.refusals), indent=2, allow_nan=False)


def exit_code_of(plan: Plan) -> int:
    """1 when anything is refused or a screening fails, else 0."""
    return 1 if plan.refusals else plan_exit_code(plan.screenings, plan.of)


__all__ = ["PlanOf", "exit_code_of", "plan_json", "plan_text", "render_advise_plan", "diff_errors", "plan_document", "plan_exit_code", "plan_table", "refusal_lines",
           "render_diff_plan", "row_plan"]
