"""Megatron-LM's own flag table, read from its argument parser (megatron/training/arguments.py, shipped
with megatron-core 0.19.2), and torchrun's: which flags exist, what each stores and how it parses.

Imported only when a launch line is read for `graphdoctor diff` (it imports megatron and torch; no CUDA).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import logging
import types
import typing
import warnings
from dataclasses import dataclass
from functools import cache
from typing import Any

from graphdoctor.errors import MissingDependencyError, UsageError
from graphdoctor.inputs import describe
from graphdoctor.suggest import did_you_mean

PATTERN_TYPES = frozenset({"moe_freq_type", "no_rope_freq_type", "la_freq_type"})
"""Megatron-LM argparse types that evaluate a list pattern (read by parse_moe_layer_freq, never eval)."""


@dataclass(frozen=True, slots=True)
class MegatronFlag:
    """One option string of Megatron-LM's parser."""

    flag: str
    dest: str
    """The `args.<dest>` it sets."""
    kind: str
    """true / false (no value), int, float, str, freq (list pattern), enum (a member name)."""
    nargs: int | str | None
    """argparse nargs: None (one value), '+', '*' or a count."""
    choices: tuple[str, ...] | None
    group: str
    """Megatron-LM's argument group title (`training`, `data and dataloader`, ...)."""
    default: Any = None
    """The parser's default for `dest` (plain values only; an enum by its member name)."""


def _kind(action: argparse.Action, flag: str) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "false" if flag.startswith("--no-") else "true"
    if isinstance(action, argparse._StoreTrueAction):
        return "true"
    if isinstance(action, argparse._StoreFalseAction):
        return "false"
    if action.type in (int, float):
        return action.type.__name__
    name = getattr(action.type, "__name__", "")
    if name in PATTERN_TYPES:
        return "freq"
    if action.choices is not None and any(isinstance(c, enum.Enum) for c in action.choices):
        return "enum"
    return "str"


def _choices(action: argparse.Action) -> tuple[str, ...] | None:
    if action.choices is None:
        return None
    return tuple(c.name if isinstance(c, enum.Enum) else str(c) for c in action.choices)


@cache
def training_arguments() -> Any:
    """Megatron-LM's megatron.training.arguments, imported with the root logger left as it was: importing
    megatron.training runs logging.basicConfig(level=INFO) with a handler on stdout (training.py:36), which would
    print every library's INFO lines into graphdoctor's output (`--json -` included).

    Raises:
        MissingDependencyError: megatron.training (part of the megatron-core wheel) does not import.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.training import arguments
    except Exception as exc:  # an optional dependency of megatron.training may raise anything at import
        raise MissingDependencyError(
            f"reading a Megatron-LM line needs megatron.training.arguments (shipped with megatron-core): "
            f"{type(exc).__name__}: {exc}".splitlines()[0][:300]) from None
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return arguments


SCRIPTS: tuple[str, ...] = ("training", "inference", "rl")
"""What a Megatron-LM line launches: pretrain_gpt.py (and the other pretrain scripts), the inference examples, or
train_rl.py; the inference examples add their own flags to Megatron-LM's parser (add_script_flags)."""


def add_script_flags(parser: argparse.ArgumentParser, script: str = "training") -> argparse.ArgumentParser:
    """Megatron-LM's parser with the flags `script` adds to it (its extra_args_provider): the inference examples'
    `add_inference_args` (megatron/inference/utils.py, recorded in graphdoctor.config.inference_flags since the
    wheel lacks it); a flag Megatron-LM's own parser already has is left to it."""
    if script != "inference":
        return parser
    from graphdoctor.config.inference_flags import INFERENCE_FLAGS, SOURCE

    group = parser.add_argument_group(title=f"inference script ({SOURCE})")
    for row in INFERENCE_FLAGS:
        options = [str(o) for o in row["options"]]  # type: ignore[attr-defined]
        if any(o in parser._option_string_actions for o in options):
            continue
        kwargs: dict[str, Any] = {"dest": row["dest"]}
        if row["action"] in ("store_true", "store_false"):
            kwargs["action"] = row["action"]
        else:
            kwargs.update(type={"int": int, "float": float}.get(str(row["type"]), str), default=row["default"])
            if row["nargs"] is not None:
                kwargs["nargs"] = row["nargs"]
        group.add_argument(*options, **kwargs)
    return parser


@cache
def megatron_flags(script: str = "training") -> dict[str, MegatronFlag]:
    """Every option string of Megatron-LM's `add_megatron_arguments` parser (with the flags `script` adds,
    add_script_flags) -> MegatronFlag.

    Raises:
        MissingDependencyError: megatron.training (part of the megatron-core wheel) does not import.
    """
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    arguments = training_arguments()
    with warnings.catch_warnings():
        # argparse warns about BooleanOptionalAction(type=...) while the parser is built; not the user's problem
        warnings.simplefilter("ignore")
        arguments.add_megatron_arguments(parser)
        add_script_flags(parser, script)
    groups = {id(a): g.title or "" for g in parser._action_groups for a in g._group_actions}
    table: dict[str, MegatronFlag] = {}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--"):
                default = action.default.name if isinstance(action.default, enum.Enum) else action.default
                table[flag] = MegatronFlag(flag, action.dest, _kind(action, flag), action.nargs,
                                           _choices(action), groups.get(id(action), ""), default)
    return table


@cache
def launcher_flags() -> frozenset[str]:
    """torchrun's option strings (torch.distributed.run), both spellings (`--nproc-per-node`, `--nproc_per_node`).

    A diff resolves launch lines on worker threads while its main thread may be importing torch: `import torch`
    comes first so that this thread waits for torch holding no submodule's import lock (holding
    torch.distributed's while the main thread's torch imports it would hand one of them a half-made torch)."""
    import torch  # noqa: F401
    from torch.distributed.run import get_args_parser

    return frozenset(f for a in get_args_parser()._actions for f in a.option_strings if f.startswith("--"))


NO_DEFAULT = object()
"""transformer_fields' default of a field that has none."""


@cache
def transformer_fields(mla: bool = False) -> dict[str, tuple[Any, Any]]:
    """TransformerConfig field name -> (annotation, default), MLATransformerConfig's with `mla`; imports
    megatron-core (CPU only)."""
    with warnings.catch_warnings():
        # megatron-core warns at import about optional packages (TE, apex); not the user's problem
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    out: dict[str, tuple[Any, Any]] = {}
    for f in dataclasses.fields(MLATransformerConfig if mla else TransformerConfig):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = NO_DEFAULT
        out[f.name] = (f.type, default)
    return out


def _matches(value: Any, annotation: Any) -> bool:
    """Loose isinstance against a dataclass annotation; unknown shapes (Literal, Callable...) pass."""
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is list or annotation is list:
        # element types too: offload_modules: [[1]] must fail here, not as a TypeError in a rule
        args = typing.get_args(annotation)
        return isinstance(value, list) and (not args or all(_matches(item, args[0]) for item in value))
    return True


def _expected(annotation: Any) -> str:
    return str(annotation).replace("typing.", "")


def validate_transformer(values: dict[str, Any], where: str) -> None:
    """Check keys against dataclasses.fields(TransformerConfig) and simple types.

    Raises:
        UsageError: an unknown key or a value of the wrong type (names the key and `where`).
    """
    known = base = transformer_fields()
    mla = transformer_fields(mla=True)
    if values.get("multi_latent_attention") or any(key in mla and key not in base for key in values):
        known = mla  # MLATransformerConfig's own fields (q_lora_rank, ...): a description leaves out its defaults
    for key, value in values.items():
        if key not in known:
            raise UsageError(f"{where}: transformer.{key} is not a TransformerConfig field{did_you_mean(key, known)}")
        annotation, default = known[key]
        # MLA's q_lora_rank is annotated int and is None for a model without query compression (Moonlight)
        optional = default is None or (key not in base and known is mla)
        if not (value is None and optional) and not _matches(value, annotation):
            raise UsageError(
                f"{where}: transformer.{key}: got {describe(value)} ({type(value).__name__}), "
                f"expected {_expected(annotation)}"
            )



__all__ = ["NO_DEFAULT", "PATTERN_TYPES", "SCRIPTS", "MegatronFlag", "add_script_flags", "launcher_flags",
           "megatron_flags", "training_arguments", "transformer_fields", "validate_transformer"]
