"""`check()`: run every static rule over a run file and/or a Megatron-LM launch line -> CheckReport.

This is the library entry point the CLI calls; it never prints. Runtime (probe) findings can be merged
into a report with `CheckReport.merged(...)`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from graphdoctor.config import RUN_FILE_SECTIONS, RunFile, load_run_file
from graphdoctor.config.bridge import BridgeConfig
from graphdoctor.config.description import plain
from graphdoctor.config.functional_test import FunctionalTest
from graphdoctor.config.launch_scan import FlagUse
from graphdoctor.config.megatron_lm import validate_transformer
from graphdoctor.envelope import SCHEMA_VERSION as ENVELOPE_SCHEMA_VERSION
from graphdoctor.errors import UsageError, where_from
from graphdoctor.rules.base import Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.facts import PESSIMISTIC, EnvironmentFacts
from graphdoctor.rules.finding import Finding, Severity
from graphdoctor.rules.megatron_args import FLAGS, MegatronArgs, parse_megatron_args, parse_megatron_uses
from graphdoctor.rules.megatron_reading import MegatronReading, read_for_check, script_kind, settled_note
from graphdoctor.rules.registry import all_rules

SCHEMA_VERSION = ENVELOPE_SCHEMA_VERSION
"""Version of the check JSON (the envelope's, graphdoctor.envelope)."""
_SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True, slots=True)
class CheckReport:
    """Result of `check()`: findings sorted by severity then code, and notes (ignored flags...)."""

    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()
    not_checked: tuple[Finding, ...] = ()
    """The rules that need the training machine (`--target`) and would report under some answer of it: kept apart
    from the findings, one line in the text output."""

    @property
    def has_errors(self) -> bool:
        """True when any finding is error-level (`graphdoctor check` then exits 1)."""
        return any(f.severity is Severity.ERROR for f in self.findings)

    def codes(self) -> list[str]:
        """Codes of the findings, in report order."""
        return [f.code for f in self.findings]

    def merged(self, findings: Iterable[Finding], notes: Iterable[str] = ()) -> CheckReport:
        """A new report with more findings (e.g. from runtime probes) and notes."""
        return CheckReport(findings=_sorted([*self.findings, *findings]), notes=(*self.notes, *notes),
                           not_checked=self.not_checked)

    def to_dict(self) -> dict[str, Any]:
        """The payload of the `check` JSON document (wrapped by graphdoctor.envelope; docs/json.md)."""
        counts = {s.value: sum(f.severity is s for f in self.findings) for s in Severity}
        return {
            "has_errors": self.has_errors,
            "counts": counts,
            "findings": [f.to_dict() for f in self.findings],
            "not_checked": [f.to_dict() for f in self.not_checked],
            "notes": list(self.notes),
        }

    def not_checked_line(self) -> str | None:
        """The one line naming the rules not checked for want of `--target`."""
        if not self.not_checked:
            return None
        codes = ", ".join(dict.fromkeys(f"{f.code} {f.name}" for f in self.not_checked))
        return f"not checked, the training machine is unknown (--target FILE|local|te=..,torch=.. names it): {codes}"


def _sorted(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: (_SEVERITY_ORDER[f.severity], f.code, f.fields)))


def _location_key(location: str) -> tuple[str, int]:
    path, _, line = location.rpartition(":")
    return (path, int(line)) if line.isdigit() else (location, 0)


def _yaml_key_lines(path: str) -> dict[str, int]:
    """`section.key` -> 1-based line of the key in a YAML run file (best effort)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            root = yaml.compose(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    lines: dict[str, int] = {}
    if not isinstance(root, yaml.MappingNode):
        return lines
    for section_node, body in root.value:
        if isinstance(body, yaml.MappingNode):
            for key_node, _ in body.value:
                lines[f"{section_node.value}.{key_node.value}"] = key_node.start_mark.line + 1
    return lines


def _run_file(source: RunFile | str | os.PathLike[str] | Mapping[str, Any] | None) -> tuple[RunFile, dict[str, str]]:
    if source is None:
        return RunFile(path="<none>", transformer={}, env={}, run={}), {}
    if isinstance(source, RunFile):
        run_file = source
    elif isinstance(source, str | os.PathLike):
        run_file = load_run_file(source)
    elif isinstance(source, Mapping):
        unknown = sorted(set(map(str, source)) - set(RUN_FILE_SECTIONS))
        if unknown:
            raise UsageError(f"run mapping: unknown section {unknown[0]!r}, expected one of {', '.join(RUN_FILE_SECTIONS)}")
        run_file = RunFile(
            path="<mapping>",
            transformer=dict(source.get("transformer") or {}),
            env={str(k): "" if v is None else str(v) for k, v in (source.get("env") or {}).items()},
            run=dict(source.get("run") or {}),
        )
    else:
        raise UsageError(f"check: got {type(source).__name__}, expected a run file path, RunFile or mapping")
    where = {}
    if run_file.path not in ("<none>", "<mapping>"):
        where = {key: f"{run_file.path}:{line}" for key, line in _yaml_key_lines(run_file.path).items()}
    return run_file, where


def build_context(
    run_file_or_mapping: RunFile | str | os.PathLike[str] | Mapping[str, Any] | None = None,
    megatron_args: str | MegatronArgs | None = None,
    env: Mapping[str, str] | None = None,
    *,
    facts: EnvironmentFacts | None = None,
) -> tuple[CheckContext, dict[str, str], list[str]]:
    """Merge and validate the inputs -> (context, `section.key` -> location, notes).

    Raises:
        UsageError / InputFileError: bad input (the message names the key or the file).
    """
    run_file, where = _run_file(run_file_or_mapping)
    validate_transformer(run_file.transformer, run_file.path)
    parsed = megatron_args if isinstance(megatron_args, MegatronArgs) or megatron_args is None \
        else parse_megatron_args(megatron_args)
    script = "training"
    if isinstance(run_file.source, FunctionalTest):
        parsed = _merged(parse_megatron_uses(list(run_file.source.uses)), parsed)
        script = run_file.source.mode
    elif isinstance(run_file.source, BridgeConfig):
        bridge = run_file.source
        run_file = _bridge_run_file(bridge)
        where = _bridge_where(bridge)
    transformer = dict(run_file.transformer)
    args: dict[str, Any] = {}
    run = dict(run_file.run)
    notes: list[str] = list(run_file.source.notes) if isinstance(run_file.source, FunctionalTest) else []
    uses: list[FlagUse] = []
    own = run.get("megatron_args")
    line, label = parsed, "--megatron-args"
    if line is None and isinstance(own, str) and own.strip():
        label = f"{run_file.path}: run.megatron_args"
        with where_from(label):
            line = parse_megatron_args(own)
    if line is not None:
        # diff's precedence (graphdoctor.config.resolve): a launch line, --megatron-args or else the run file's own
        # run.megatron_args, sits under the run file's transformer: and run: values.
        validate_transformer(line.transformer, label)
        transformer = {**line.transformer, **transformer}
        args = dict(line.args)
        run = {**line.run, **run}
        where = {**line.locations, **where}
        notes.extend(line.notes)
        uses.extend(line.uses)
    if facts is None:
        facts = EnvironmentFacts.unknown_machine(run.get("gpu_arch"))
    exported = dict(line.env) if line is not None else {}
    merged_env = {**facts.env, **exported, **run_file.env, **{str(k): str(v) for k, v in (env or {}).items()}}
    reading = None
    if uses:
        if script == "training":
            script = script_kind(next((u.script for u in uses if u.script), None))
        reading = read_for_check(uses, env=merged_env, script=script, capability=_capability(facts),
                                 values=run_file.transformer)
        _settle(reading, transformer, args, run, notes, kept=set(run_file.transformer))
        for unknown in reading.unknown:
            where[f"flag.{unknown.flag}"] = unknown.where or unknown.flag
        where.setdefault("megatron_line", next((u.where for u in uses if u.where), "--megatron-args"))
    ctx = CheckContext(
        transformer=transformer, args=args, run=run, env=merged_env, facts=facts,
        megatron_lm=line is not None, megatron=reading,
        bridge=run_file.source if isinstance(run_file.source, BridgeConfig) else None,
    )
    return ctx, where, notes


def _capability(facts: EnvironmentFacts) -> tuple[int, int] | None:
    """The training GPU's compute capability validate_args is asked for, when the facts know it."""
    arch = facts.gpu_capability
    return (int(arch[0]), int(arch[1])) if arch is not None else None


def _settle(reading: MegatronReading, transformer: dict[str, Any], args: dict[str, Any], run: dict[str, Any],
            notes: list[str], *, kept: set[str]) -> None:
    """What validate_args set by itself, into the settings the rules read (FLAGS' keys), and its one note; the
    TransformerConfig fields a run file gives beside the line (`kept`) stay as given (Megatron-LM never saw them)."""
    from graphdoctor.config.megatron_lm import megatron_flags

    notes.extend(reading.notes)
    if reading.args is None:
        return
    table = megatron_flags(reading.script)
    sections = {"transformer": transformer, "args": args, "run": run}
    read: list[str] = []
    for flag, (section, key, kind) in FLAGS.items():
        spec = table.get(flag)
        if spec is None or spec.dest not in reading.settled or spec.dest in read or \
                (section == "transformer" and key in kept):
            continue
        value = reading.settled[spec.dest]
        if kind in ("true", "false") and value is None:
            value = False
        sections[section][key] = value
        read.append(spec.dest)
    note = settled_note(reading, read)
    if note:
        notes.append(note)


def _merged(first: MegatronArgs, second: MegatronArgs | None) -> MegatronArgs:
    """A functional test's flags with a --megatron-args line over them."""
    if second is None:
        return first
    return MegatronArgs(transformer={**first.transformer, **second.transformer}, args={**first.args, **second.args},
                        run={**first.run, **second.run}, locations={**first.locations, **second.locations},
                        notes=[*first.notes, *second.notes], uses=[*first.uses, *second.uses],
                        env={**first.env, **second.env})


def _bridge_run_file(bridge: BridgeConfig) -> RunFile:
    """A Megatron-Bridge config as the rules read a run file: its model's TransformerConfig fields and graph
    settings (plain: enums by name), its batch and sequence as `run:`; `source` stays the Bridge config (the
    context's `bridge`, for Bridge's own refusals)."""
    transformer = {k: plain(v) for k, v in bridge.transformer.items()}
    transformer.update({k: v for k, v in bridge.graph.items() if v is not None})
    run = {k: v for k, v in bridge.run.items() if k in ("micro_batch_size", "eval_interval", "eval_iters")}
    if bridge.model.get("seq_length") is not None:
        run["seq_length"] = bridge.model["seq_length"]
    return RunFile(path=bridge.path, transformer=transformer, env=dict(bridge.env), run=run, source=bridge)


def _bridge_where(bridge: BridgeConfig) -> dict[str, str]:
    """A Megatron-Bridge config's key locations: `model.X` also as `transformer.X` (what the Megatron-side rules
    name), every key as the file names it (`rerun_state_machine.check_for_nan_in_loss`, for the Bridge rules)."""
    model = {f"transformer.{key.removeprefix('model.')}": at for key, at in bridge.where.items()
             if key.startswith("model.")}
    return {**bridge.where, **model}


def check(
    run_file_or_mapping: RunFile | str | os.PathLike[str] | Mapping[str, Any] | None = None,
    megatron_args: str | MegatronArgs | None = None,
    env: Mapping[str, str] | None = None,
    *,
    facts: EnvironmentFacts | None = None,
    select: Iterable[str] | None = None,
) -> CheckReport:
    """Run the static rule catalogue.

    Args:
        run_file_or_mapping: a run file path, a loaded RunFile, or a mapping with optional
            `transformer:` / `env:` / `run:` sections; None for a launch line only.
        megatron_args: a Megatron-LM launch line, `@path` to one, or an already parsed MegatronArgs.
        env: environment variables of the training job; merged over the run file's `env:`
            (the checking shell's own environment is never read).
        facts: facts of the training machine (TE/torch versions, GPU arch, recorded env); None: an
            unknown machine, whose installation rules report info "not checked"
            (`detect_facts()` judges against this machine, graphdoctor.rules.target a declared one).
        select: only run these codes (default: every static rule).

    Returns:
        The CheckReport.

    Raises:
        UsageError / InputFileError: bad input; nothing is checked then.
    """
    ctx, where, notes = build_context(run_file_or_mapping, megatron_args, env, facts=facts)
    wanted = {c.upper() for c in select} if select is not None else None
    findings: list[Finding] = []
    unchecked: list[Finding] = []
    not_applied = 0
    for rule in all_rules():
        if rule.runtime or (wanted is not None and rule.code not in wanted):
            continue
        if not ctx.training_graphs and not rule.applies_to_inference:
            not_applied += 1
            continue
        reported: set[tuple[str, ...]] = set()
        for hit in rule.detect(ctx):
            reported.add(hit.fields)
            findings.append(rule.finding(fields=hit.fields, locations=_locations(hit.fields, where),
                                         severity=hit.severity, **hit.params))
        for fields in _unchecked_hits(rule, ctx) - reported:
            unchecked.append(rule.not_checked(fields=fields, locations=_locations(fields, where)))
    if not_applied:
        notes.append(f"{_inference_only(ctx)}: the {not_applied} rules about graphs replayed in training do not apply")
    return CheckReport(findings=_sorted(findings), notes=tuple(dict.fromkeys(notes)), not_checked=_sorted(unchecked))


def _inference_only(ctx: CheckContext) -> str:
    """Why the line's graphs are inference graphs only."""
    if ctx.megatron is not None and ctx.megatron.script == "rl":
        return "train_rl.py without --rl-training-cuda-graphs captures graphs for its rollouts only"
    return "an inference script (MODE: inference) captures inference graphs only"


def _locations(fields: tuple[str, ...], where: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(sorted(dict.fromkeys(where[f] for f in fields if f in where), key=_location_key))


def _unchecked_hits(rule: Rule, ctx: CheckContext) -> set[tuple[str, ...]]:
    """Fields a machine rule would report under some worst case of the unknown machine facts."""
    unknown = ctx.facts.unknown.intersection(rule.machine_facts)
    if not unknown:
        return set()
    out: set[tuple[str, ...]] = set()
    for case in PESSIMISTIC:
        values = {k: v for k, v in case.items() if k in ctx.facts.unknown}
        if not values:
            continue
        worst = replace(ctx, facts=replace(ctx.facts, **values,  # type: ignore[arg-type]
                                           unknown=ctx.facts.unknown - values.keys()))
        out.update(hit.fields for hit in rule.detect(worst))
    return out


__all__ = ["SCHEMA_VERSION", "CheckReport", "build_context", "check"]
