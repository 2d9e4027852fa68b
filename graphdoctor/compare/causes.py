"""Name the cause of an implementation's difference from the evidence its graphed child gathered.

The child's witness (graphdoctor.child.witness) and hazard observers report Hazard events: a rule, a module,
the user's `file:line`, a step. Here every one becomes a Cause of the row, and the one that accounts for the
row's difference becomes its diagnosis (rule, module, file:line, fix), chosen by what differs:

- a training step's loss, gradients or parameters: an attribute rebound after capture (GD509), a host value
  baked into the graph (GD518), capture-dependent control flow (GD519), a graph buffer kept across
  micro-batches or replays (GD520), a None attention mask under TE graphs (GD511), or FP8 state replaced after
  capture (GD521), a tensor the graphs read replaced by its holder anywhere in the run (GD522: the optimizer's loss
  scaler, a parameter group, a closure, a global); the one whose module is where the taps, the first differing FP8
  state or the first differing gradient put the difference, else the earliest;
- dropout draws only (rng-divergence: the dropout-free control pair matches): a generator state of Megatron's RNG
  tracker replaced after the graphs registered it (GD522 on `rng_tracker.states_[...]`);
- a reported value frozen over the replays (a GD513 note): the host value baked at capture that makes it;
- an evaluation only (every training step matches): a training graph replayed by evaluation (GD402 when
  Megatron's runner replays it, GD514 when the user's code does).

A row that matches keeps its verdict: its causes are notes (the hazard is there; this run measured no effect).
Pure Python on RunRecords.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from graphdoctor.compare.cause import FACTORIES, HOOK, Cause
from graphdoctor.compare.divergence import Divergence
from graphdoctor.compare.phases import FROZEN_VALUE_RULE
from graphdoctor.compare.verdict import ImplResult
from graphdoctor.protocol.events import RNG_HOLDER, Hazard
from graphdoctor.protocol.record import RunRecord
from graphdoctor.rules import get_rule, rule_fix
from graphdoctor.types import Diagnosis, Verdict

TRAINING_CAUSES: frozenset[str] = frozenset({"GD509", "GD518", "GD519", "GD520", "GD511", "GD521", "GD522"})
"""Rules whose evidence explains a training step's difference."""

EVAL_CAUSES: frozenset[str] = frozenset({"GD402", "GD514"})
"""Rules whose evidence explains an evaluation's difference."""


def cause_of(hazard: Hazard) -> Cause:
    """The Cause of one hazard (its rule's name, severity and fix from the catalogue)."""
    rule = get_rule(hazard.rule)
    return Cause(rule=hazard.rule, name=rule.name, severity=rule.severity.value, module=hazard.module,
                 location=hazard.location, message=hazard.message, fix=hazard.fix or rule.fix_title(), step=hazard.step,
                 also_at=hazard.also_at, phase=hazard.phase, subject=hazard.subject)


def grouped(causes: Iterable[Cause]) -> list[Cause]:
    """One cause per (rule, file:line): the same line seen in several modules (every layer's MLP) is one
    cause, its first module named and the others listed in its message; evidence of a rule in a module with
    no line (FP8 state seen replaced) gives way to evidence of it there with the user's line."""
    causes = list(causes)
    located = {(c.rule, c.module) for c in causes if c.location}
    out: dict[tuple[str, str | None], list[Cause]] = {}
    for cause in causes:
        if cause.location is None and (cause.rule, cause.module) in located:
            continue  # the same evidence seen where the user's line is known
        out.setdefault((cause.rule, cause.location), []).append(cause)
    merged = []
    for same in out.values():
        first = same[0]
        others = list(dict.fromkeys(c.module for c in same[1:] if c.module and c.module != first.module))
        if others:
            first = dataclasses.replace(first, message=f"{first.message}; the same in {', '.join(others)}")
        merged.append(first)
    return merged


def related(a: str | None, b: str | None) -> bool:
    """Whether two module (or parameter) names are the same or one contains the other."""
    if not a or not b:
        return False
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _module_of(tensor: str | None) -> str | None:
    return tensor.rsplit(".", 1)[0] if tensor and "." in tensor else tensor


def _focus(result: ImplResult) -> list[str]:
    """Where the difference is, most specific first: the taps' first differing module, the first differing FP8
    state's module, the first differing main_grad in backward order, the first in parameter order."""
    div, diag = result.divergence, result.diagnosis
    out = [diag.module] if diag is not None and diag.module else []
    if result.fp8_state is not None and result.fp8_state.module:
        out.append(result.fp8_state.module)
    if div is not None and div.what == "fp8_state" and div.tensor:
        out.append(div.tensor.partition(":")[0])
    elif div is not None:
        out += [m for m in (_module_of(div.backward_tensor), _module_of(div.tensor)) if m]
    return out


def _pick(causes: Sequence[Cause], rules: frozenset[str], focus: Sequence[str]) -> Cause | None:
    candidates = [c for c in causes if c.rule in rules]
    for place in focus:
        hit = next((c for c in candidates if related(c.module, place)), None)
        if hit is not None:
            return hit
    return min(candidates, key=lambda c: (c.step if c.step is not None else 1 << 30)) if candidates else None


def _frozen_value(result: ImplResult) -> bool:
    return any(n.startswith(FROZEN_VALUE_RULE) for n in result.notes)


def _explained(result: ImplResult, causes: Sequence[Cause]) -> tuple[Cause | None, str | None]:
    """(the cause that explains the row's difference, the rule its diagnosis shows) or (None, None)."""
    if result.verdict == Verdict.RNG_DIVERGENCE and result.divergence is not None:
        rng = [c for c in causes if c.rule == "GD522" and (c.subject or "").startswith(RNG_HOLDER)]
        return (rng[0], rng[0].rule) if rng else (None, None)
    if result.verdict != Verdict.NUMERIC_DIVERGENCE or result.divergence is None:
        return None, None
    div = result.divergence
    if div.what == "eval":
        cause = _pick(causes, EVAL_CAUSES, _focus(result))
        return cause, cause.rule if cause else None
    if div.what == "reported" and _frozen_value(result):
        baked = [c for c in causes if c.rule == "GD518" and c.subject in FACTORIES]
        return (baked[0], FROZEN_VALUE_RULE) if baked else (None, None)
    cause = _pick(causes, TRAINING_CAUSES, _focus(result))
    return cause, cause.rule if cause else None


def _diagnosis(result: ImplResult, cause: Cause, rule: str) -> Diagnosis:
    previous = result.diagnosis
    entry = get_rule(rule)
    localized = previous.message if previous is not None and previous.error_type == "numeric-divergence" else None
    div = result.divergence
    meaning = f"{entry.code} {entry.name}: {_first_sentence(entry.summary())}"
    if localized:
        meaning += f"; {localized}"
    elif div is not None:
        meaning += f"; first difference: {_first_difference(div)}"
    fix = cause.fix if rule == cause.rule else rule_fix(rule)
    # the row's own verdict heads the line: a reseeded RNG tracker explains an rng-divergence
    return Diagnosis(error_type=result.verdict.value, message=cause.message, meaning=meaning, fix=fix,
                     rule=rule, module=cause.module or None, location=cause.location,
                     step=cause.step if cause.step is not None else (div.step if div else None),
                     phase=cause.phase, also_at=cause.also_at)


def _first_sentence(text: str) -> str:
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _first_difference(div: Divergence) -> str:
    if div.what == "eval":
        return f"{div.label} after step {div.step}"
    if div.what in ("grads", "params") and div.tensor:
        return f"step {div.step} {div.label} ({div.tensor})"
    return f"step {div.step} {div.label}"


def _hook_notes(result: ImplResult, hooks: Iterable[Hazard], explained: Cause | None) -> list[str]:
    """Backward-side localization: the first differing main_grad in backward order, and each user hook on
    or around it (its registration site)."""
    div = result.divergence
    if div is None or div.backward_tensor is None or result.verdict != Verdict.NUMERIC_DIVERGENCE:
        return []
    notes = []
    if div.backward_tensor != div.tensor:
        notes.append(f"backward: the first differing main_grad in backward order is {div.backward_tensor} "
                     f"(step {div.step}); {div.tensor} is the first in parameter order")
    target = _module_of(div.backward_tensor)
    for hook in hooks:
        if related(hook.module, target) and (explained is None or explained.location != hook.location):
            notes.append(f"backward: a hook registered at {hook.location} ({hook.subject}) is on {hook.module}, "
                         f"where {div.backward_tensor} is: {hook.message}")
    return notes


def apply_causes(result: ImplResult, graphed: RunRecord) -> ImplResult:
    """The row with every cause its graphed run's evidence names, and the diagnosis of the one that explains
    its difference (the earlier diagnosis, the taps' localization, becomes its meaning)."""
    hooks = [h for h in graphed.hazards if h.rule == HOOK]
    evaluation_differs = result.divergence is not None and result.divergence.what == "eval" \
        and result.verdict == Verdict.NUMERIC_DIVERGENCE
    # A training graph replayed by evaluation matters where an evaluation differs (the static GD402 note says
    # the rest): Megatron's local runners do it in every run that evaluates.
    causes = grouped(cause_of(h) for h in graphed.hazards
                     if h.rule != HOOK and (h.rule not in EVAL_CAUSES or evaluation_differs))
    if not causes and not hooks:
        return result
    explained, rule = _explained(result, causes)
    notes = list(result.notes)
    diagnosis = result.diagnosis
    if explained is not None and rule is not None:
        diagnosis = _diagnosis(result, explained, rule)
        causes = [dataclasses.replace(c, explains=True) if c is explained else c for c in causes]
    notes += _hook_notes(result, hooks, explained)
    for cause in causes:
        if not cause.explains:
            notes.append(cause.line() if result.verdict != Verdict.MATCH else
                         f"{cause.line()} [seen, no difference measured in this run]")
    return dataclasses.replace(result, diagnosis=diagnosis, notes=tuple(notes), causes=tuple(causes))


__all__ = ["EVAL_CAUSES", "HOOK", "TRAINING_CAUSES", "apply_causes", "cause_of", "related"]
