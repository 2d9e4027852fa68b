"""A Megatron-LM line as the run gets it, for `check`: Megatron-LM's own parser and validate_args on the line's flags.

The rules read a launch line through graphdoctor's table of the flags they judge (graphdoctor.rules.megatron_args);
what Megatron-LM's parser refuses, and what validate_args sets by itself, come from Megatron-LM here:
- a flag neither Megatron-LM's parser (with the flags its script adds) nor torchrun knows is an unknown flag, with
  the closest known one (GD130); the others are still read;
- a value the parser refuses, a setting validate_args refuses and a placement that cannot fit are Megatron's
  refusal, with its message and file:line (GD131);
- a setting validate_args changes (the TE RNG tracker it turns on for TE graphs, `--enable-cuda-graph` rewritten to
  `--cuda-graph-impl local`, sequence parallel turned off at TP 1) is what the rules judge, named in one note.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphdoctor.config.launch_scan import FlagUse
from graphdoctor.errors import MissingDependencyError
from graphdoctor.suggest import did_you_mean

HOPPER: tuple[int, int] = (9, 0)
BLACKWELL: tuple[int, int] = (10, 0)

NOT_NOTED: frozenset[str] = frozenset({"moe_router_load_balancing_type", "cuda_graph_modules", "add_qkv_bias",
                                      "ffn_hidden_size"})
"""Dests validate_args only normalises (a list of one name to the name, names to enum members) or derives from
others as it always does (the QKV bias from --add-bias-linear, the default ffn size): applied, not named in the
note."""


@dataclass(frozen=True, slots=True)
class UnknownFlag:
    """A flag Megatron-LM's parser would refuse."""

    flag: str
    where: str
    hint: str
    """` (did you mean --x?)` or empty."""


@dataclass(frozen=True, slots=True)
class MegatronReading:
    """What Megatron-LM's parser and validate_args make of a line."""

    script: str = "training"
    """What the line launches (graphdoctor.config.megatron_lm.SCRIPTS)."""
    unknown: tuple[UnknownFlag, ...] = ()
    refusal: str | None = None
    """Megatron's refusal (`Megatron-LM's validate_args refuses the line: ...`), or None."""
    settled: Mapping[str, Any] = field(default_factory=dict)
    """Dest -> the value validate_args leaves, for the dests it changed (plain values: enums by name)."""
    given: Mapping[str, Any] = field(default_factory=dict)
    """Dest -> the value the line gave (or the parser's default), for the same dests."""
    args: Any = None
    """The validated Namespace (None when Megatron refused the line or could not be asked)."""
    notes: tuple[str, ...] = ()

    @property
    def training_graphs(self) -> bool:
        """The run captures graphs while training: never for the inference scripts; for train_rl.py only with
        --rl-training-cuda-graphs (its graphs are otherwise the rollouts' inference graphs)."""
        if self.script == "inference":
            return False
        if self.script == "rl":
            return self.args is None or bool(getattr(self.args, "rl_training_cuda_graphs", False))
        return True


EXACT_SCRIPTS = re.compile(r"^(pretrain_\w+\.py|train_rl\.py|gpt_(dynamic|static)_inference\.py)$")
"""Megatron-LM entry points whose whole parser graphdoctor knows (Megatron-LM's, with the inference examples'
add_inference_args): a flag it does not know is GD130. Another script may add flags of its own: there an unknown
flag is a note."""


def script_kind(name: str | None) -> str:
    """`training`, `inference` or `rl` for a launched script (None: a bare flag list, read as pretrain_gpt.py)."""
    if name is None:
        return "training"
    stem = name.removesuffix(".py").rsplit(".", 1)[-1]
    if stem == "train_rl":
        return "rl"
    return "inference" if "inference" in stem else "training"


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _world(line: Any) -> int | None:
    """The processes the line's torchrun starts (--nproc-per-node x --nnodes), when it says so in numbers."""
    from graphdoctor.config.megatron_line import torchrun_counts

    counts = torchrun_counts(line)
    return counts[0] * counts[1] if counts is not None and counts[0] * counts[1] > 0 else None


def read_for_check(uses: Sequence[FlagUse], *, env: Mapping[str, str] | None = None, script: str = "training",
                   capability: tuple[int, int] | None = None,
                   values: Mapping[str, Any] | None = None) -> MegatronReading:
    """Megatron-LM's parser and validate_args on a line's flag uses (see the module doc), with the settings of
    `values` (a run file's TransformerConfig fields beside the line, by Megatron-LM's names) put in as flags over
    the line's, as the run would get them. The processes are the torchrun line's where it gives them, else the
    fewest the line's model parallelism fits.

    Never raises for what Megatron refuses (that is the reading's `refusal`); when megatron.training does not import
    here, the reading says so in a note and judges nothing.
    """
    from graphdoctor.config.from_megatron import required_settings
    from graphdoctor.config.megatron_line import MegatronRefusal, dest_values, read_uses, with_values
    from graphdoctor.config.megatron_lm import launcher_flags, megatron_flags

    try:
        table = megatron_flags(script)
        launcher = launcher_flags()
    except MissingDependencyError as exc:
        return MegatronReading(script=script, notes=(f"Megatron-LM's parser was not asked: {exc}",))
    unknown: list[UnknownFlag] = []
    known: list[FlagUse] = []
    for use in uses:
        if use.launcher or use.flag in table or use.flag in launcher:
            known.append(use)
        elif use.flag not in [u.flag for u in unknown]:
            unknown.append(UnknownFlag(use.flag, use.where or use.flag, did_you_mean(use.flag, table, cutoff=0.75)))
    scripts = {u.script for u in uses if u.script is not None}
    own: tuple[str, ...] = ()
    if unknown and any(not EXACT_SCRIPTS.match(name.rsplit("/", 1)[-1]) for name in scripts):
        own = (f"flags Megatron-LM's parser does not know, which {', '.join(sorted(scripts))} may add itself: "
               + ", ".join(u.flag for u in unknown),)
        unknown = []
    line = _with_run_file(read_uses(known, env=env, script=script, refused={}), values or {}, table)
    missing, completed = required_settings(dest_values(line), {}, "validated with")
    line = with_values(line, missing)
    notes = [n for n in (*own, *line.notes, completed) if n]
    try:
        given, args, warned = _validated(line, _world(line), capability, notes)
    except MegatronRefusal as refusal:
        if refusal.stage == "validate_args" and "--use-checkpoint-args" in line.flags():
            notes.append(f"not judged: {refusal} (with --use-checkpoint-args, Megatron-LM takes the model's settings "
                         "from the checkpoint before it validates them)")
            return MegatronReading(script=script, unknown=tuple(unknown), notes=tuple(notes))
        return MegatronReading(script=script, unknown=tuple(unknown), refusal=str(refusal), notes=tuple(notes))
    settled: dict[str, Any] = {}
    before: dict[str, Any] = {}
    after = vars(args)
    for dest in dict.fromkeys([*vars(given), *after]):
        old, value = getattr(given, dest, None), after.get(dest)  # validate_args deletes what it rewrites
        if _plain(old) != _plain(value):
            settled[dest], before[dest] = _plain(value), _plain(old)
    return MegatronReading(script=script, unknown=tuple(unknown), settled=settled, given=before, args=args,
                           notes=(*notes, *warned))


def _with_run_file(line: Any, values: Mapping[str, Any], table: Mapping[str, Any]) -> Any:
    """The line with the run file's values that are Megatron-LM settings put in as their flags (a value no flag
    spells stays out: the rules still read it from the run file)."""
    from graphdoctor.config.megatron_line import with_values
    from graphdoctor.errors import UsageError

    dests = {spec.dest for spec in table.values()}
    for dest, value in values.items():
        if dest in dests:
            try:
                line = with_values(line, {dest: value})
            except UsageError:
                continue
    return line


def _validated(line: Any, world: int | None, capability: tuple[int, int] | None, notes: list[str],
               ) -> tuple[Any, Any, tuple[str, ...]]:
    """parse_and_validate for the training GPU; where it is unknown, for Hopper, then Blackwell when Hopper is refused
    (validate_args asks some settings of Hopper only: CUDA_DEVICE_MAX_CONNECTIONS with tensor parallelism), saying
    so in `notes`.

    Raises:
        MegatronRefusal: Megatron refuses the line (on both, for an unknown GPU).
    """
    from graphdoctor.config.megatron_line import MegatronRefusal, parse_and_validate

    if capability is not None:
        return parse_and_validate(line, world_size=world, capability=capability)
    try:
        return parse_and_validate(line, world_size=world, capability=HOPPER)
    except MegatronRefusal as hopper:
        if hopper.stage != "validate_args":
            raise
        try:
            out = parse_and_validate(line, world_size=world, capability=BLACKWELL)
        except MegatronRefusal:
            raise hopper from None
        notes.append(f"judged for a Blackwell GPU (sm_100): on Hopper (sm_90) {hopper}; --gpu-arch names the "
                     "training GPU")
        return out


def _change(dest: str, value: Any, given: Any) -> str:
    if value is None:
        return f"{dest} dropped (the line: {given!r})"
    return f"{dest} {value!r} (the line: {given!r})"


def settled_note(reading: MegatronReading, dests: Sequence[str]) -> str | None:
    """The one note naming what validate_args set by itself among `dests` (those the rules read)."""
    warned = " ".join(reading.notes)
    parts = [_change(dest, reading.settled[dest], reading.given[dest]) for dest in dests
             if dest in reading.settled and dest not in NOT_NOTED and reading.given.get(dest) is not None
             and dest not in warned]
    if not parts:
        return None
    return "Megatron-LM's validate_args sets, and the rules judge: " + ", ".join(parts)


__all__ = ["EXACT_SCRIPTS", "NOT_NOTED", "script_kind", "MegatronReading", "UnknownFlag", "read_for_check", "settled_note"]
