"""A Megatron-LM launch line, read by Megatron-LM's own code: its flags (graphdoctor.config.launch_scan, or a
functional test's MODEL_ARGS), graphdoctor's overrides put in as flags, then Megatron-LM's `parse_args` and
`validate_args` (megatron/training/arguments.py, shipped with megatron-core), so that everything validate_args
derives is what the run gets, and `core_transformer_config_from_args` with `gpt_config_from_args` (or
`hybrid_config_from_args`) for the model.

Megatron's parser reads sys.argv and the environment, validate_args prints its argument table, warns, may set
torch's determinism and asks the GPU its compute capability: megatron_args() runs it with all of that saved and
restored, the GPU answered from what graphdoctor knows of the training GPU (never by creating a CUDA context).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import io
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

from graphdoctor.config.description import ModelDescription, describe_model, unvalidated_class
from graphdoctor.config.launch_scan import FlagUse
from graphdoctor.config.megatron_lm import (
    MegatronFlag,
    add_script_flags,
    launcher_flags,
    megatron_flags,
    training_arguments,
)
from graphdoctor.errors import UsageError
from graphdoctor.installed import te_findable
from graphdoctor.process_env import ENVIRON_LOCK
from graphdoctor.suggest import did_you_mean

LAUNCH_SCRIPT = "pretrain_gpt.py"
"""argv[0] Megatron-LM's parser sees."""

DEFAULT_CAPABILITY: tuple[int, int] = (9, 0)
"""The training GPU validate_args is judged for when none is known (Hopper, the GPUs graphdoctor is measured on)."""

RUN_DESTS: frozenset[str] = frozenset({
    "micro_batch_size", "global_batch_size", "seq_length", "seed", "eval_interval", "eval_iters",
    "overlap_grad_reduce", "use_distributed_optimizer", "ddp_bucket_size", "te_rng_tracker", "bf16", "fp16",
    "loss_scale",
})
"""Megatron-LM settings outside the model config that diff's children take (graphdoctor.config.resolve)."""

GRAPH_DESTS: frozenset[str] = frozenset({"cuda_graph_impl", "cuda_graph_modules", "cuda_graph_scope_deprecated",
                                         "enable_cuda_graph", "external_cuda_graph"})
"""The CUDA-graph settings: each child sets its own (child_flags)."""

REFUSED_DESTS: dict[str, str] = {
    "yaml_cfg": "diff reads the flags of a launch line, not Megatron-LM's experimental --yaml-cfg",
    "use_checkpoint_args": "diff builds the model from the line's own flags, not a checkpoint's",
}

@dataclass(frozen=True, slots=True)
class MegatronLine:
    """A launch line as Megatron-LM's parser takes it: `--flag value...` groups, torchrun's settings beside them."""

    groups: tuple[tuple[str, ...], ...]
    """Each Megatron-LM flag with its values, in order (a later group wins, as in argparse)."""
    launcher: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """torchrun's flags (`--nproc-per-node`, `--nnodes`, ...) -> values."""
    where: Mapping[str, str] = field(default_factory=dict)
    """Flag -> where the line set it (`train.sh:12`), for notes and findings."""
    notes: tuple[str, ...] = ()
    """What reading the line left out (values that are shell variables it does not set)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables the source sets for the run (a functional test's ENV_VARS)."""
    script: str = "training"
    """What the line launches (graphdoctor.config.megatron_lm.SCRIPTS): which flags the parser takes."""

    def argv(self) -> list[str]:
        """The flags as one argv."""
        return [token for group in self.groups for token in group]

    def flags(self) -> list[str]:
        """The Megatron-LM flags given, in order, once each."""
        return list(dict.fromkeys(group[0] for group in self.groups))


def read_uses(uses: Sequence[FlagUse], *, env: Mapping[str, str] | None = None, script: str = "training",
              refused: Mapping[str, str] = REFUSED_DESTS) -> MegatronLine:
    """The launch line of scanned flag uses: launcher flags apart, every other flag Megatron-LM's (with the flags
    `script` adds).

    Raises:
        UsageError: a flag neither Megatron-LM's parser nor torchrun's knows (with the closest), or a flag of
            `refused` (dest -> why).
        MissingDependencyError: Megatron-LM's argument parser does not import.
    """
    table = megatron_flags(script)
    groups: list[tuple[str, ...]] = []
    launcher: dict[str, tuple[str, ...]] = {}
    where: dict[str, str] = {}
    skipped: list[str] = []
    for use in uses:
        spec = table.get(use.flag)
        if use.launcher or (spec is None and use.flag in launcher_flags()):
            launcher[use.flag.replace("_", "-")] = use.values
            continue
        if spec is None:
            at = f" ({use.where})" if use.where else ""
            raise UsageError(f"{use.flag}{at} is not a Megatron-LM flag{did_you_mean(use.flag, table, cutoff=0.6)} "
                             "(Megatron-LM's parser refuses it)")
        if spec.dest in refused:
            raise UsageError(f"{use.flag}: {refused[spec.dest]}")
        if use.unresolved and not use.values and spec.kind not in ("true", "false"):
            skipped.append(f"{use.flag} {use.unresolved[0]}")
            continue
        groups.append((use.flag, *use.values))
        if use.where:
            where.setdefault(use.flag, use.where)
    notes: tuple[str, ...] = ()
    if skipped:
        notes = ("values that are shell variables the text does not set were skipped (the flag is left out): "
                 + ", ".join(skipped),)
    return MegatronLine(groups=tuple(groups), launcher=launcher, where=where, notes=notes, env=dict(env or {}),
                        script=script)


def flag_group(dest: str, value: Any) -> tuple[str, ...] | None:
    """The flag group that gives `dest` the `value` (None: the parser's default already is that value).

    Raises:
        UsageError: no flag of Megatron-LM's parser sets `dest` to `value`.
    """
    specs = [s for s in megatron_flags().values() if s.dest == dest]
    if not specs:
        raise UsageError(f"{dest}: no Megatron-LM flag sets it")
    if isinstance(value, bool) or any(s.kind in ("true", "false") for s in specs):
        if value == specs[0].default or (value is False and specs[0].default is None):
            return None
        wanted = "true" if value else "false"
        for spec in specs:
            if spec.kind == wanted:
                return (spec.flag,)
        raise UsageError(f"{dest}: no Megatron-LM flag sets it to {value}")
    if value is None:
        return None
    spec = next((s for s in specs if not s.flag.startswith("--no-")), specs[0])
    values = value if isinstance(value, list | tuple) else [value]
    if not values:
        return None
    return (spec.flag, *(str(v) for v in values))


def with_values(line: MegatronLine, values: Mapping[str, Any]) -> MegatronLine:
    """The line with the Megatron-LM settings of `values` (dest -> value): every flag for those dests goes, and
    the flag for each new value is appended (nothing where the parser's default is the value)."""
    table = megatron_flags(line.script)
    kept = [g for g in line.groups if table[g[0]].dest not in values]
    for dest, value in values.items():
        group = flag_group(dest, value)
        if group is not None:
            kept.append(group)
    return replace(line, groups=tuple(kept))


def dest_values(line: MegatronLine) -> dict[str, tuple[str, ...]]:
    """Dest -> the values of the last flag that sets it (as argparse keeps the last)."""
    table = megatron_flags(line.script)
    return {table[g[0]].dest: g[1:] for g in line.groups}


class _Gpu:
    """What validate_args reads of the GPU: get_device_properties(...).major/.minor."""

    def __init__(self, capability: tuple[int, int]) -> None:
        self.major, self.minor = capability
        self.name = f"sm_{capability[0]}{capability[1]}"


@contextlib.contextmanager
def _megatron_process(argv: list[str], world_size: int, env: Mapping[str, str],
                      capability: tuple[int, int]) -> Iterator[tuple[list[warnings.WarningMessage], io.StringIO]]:
    """sys.argv, the environment, torch's determinism and the GPU as Megatron-LM's parser reads them, restored
    afterwards; stdout and stderr captured; one parse at a time in this process, and no copy of the environment
    taken meanwhile (graphdoctor.process_env)."""
    import torch

    with ENVIRON_LOCK:
        saved_argv, saved_env = sys.argv, dict(os.environ)
        deterministic = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        saved_capability, saved_properties = torch.cuda.get_device_capability, torch.cuda.get_device_properties
        errors = io.StringIO()
        try:
            sys.argv = [LAUNCH_SCRIPT, *argv]
            os.environ.update({str(k): str(v) for k, v in env.items()})
            os.environ.update(WORLD_SIZE=str(world_size), RANK="0")
            torch.cuda.get_device_capability = lambda device=None: capability  # type: ignore[assignment]
            torch.cuda.get_device_properties = lambda device=None: _Gpu(capability)  # type: ignore[assignment,return-value]
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors), \
                    warnings.catch_warnings(record=True) as caught, _quiet_logging():
                warnings.simplefilter("always")
                yield caught, errors
        finally:
            sys.argv = saved_argv
            os.environ.clear()
            os.environ.update(saved_env)
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
            torch.cuda.get_device_capability = saved_capability  # type: ignore[assignment]
            torch.cuda.get_device_properties = saved_properties  # type: ignore[assignment]


@contextlib.contextmanager
def _quiet_logging() -> Iterator[None]:
    """Megatron's INFO and WARNING log lines while it validates (its pipeline-layout table, ...) kept out of
    graphdoctor's output; what it warns of reaches the notes through `warnings`."""
    import logging

    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


MEGATRON_ERRORS = (Exception,)
"""What Megatron-LM's argument checks and config classes raise for settings they refuse: anything (assertions,
ValueError, a KeyError for an unknown enum name, a ZeroDivisionError for --num-layers 0); only Megatron's code runs
inside, on the user's values."""


def megatron_message(exc: BaseException) -> str:
    """One line of what Megatron said; for a bare `assert`, the check itself at Megatron's file:line."""
    import linecache
    import traceback

    text = str(exc).strip().splitlines()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "megatron/" in f.filename.replace(os.sep, "/")]
    where = ""
    if frames:
        path = frames[-1].filename.replace(os.sep, "/")
        where = f"{path[path.rfind('megatron/'):]}:{frames[-1].lineno}"
    if text and isinstance(exc, AssertionError | ValueError):
        return text[0][:300]
    if text:
        return f"{type(exc).__name__}: {text[0][:240]}" + (f" (at {where})" if where else "")
    if not frames:
        return type(exc).__name__
    source = (linecache.getline(frames[-1].filename, frames[-1].lineno or 0) or frames[-1].line or "").strip()
    return f"{where}: {source}"[:300]


def needs_te(exc: BaseException) -> bool:
    """An error Megatron raises because Transformer Engine is missing here."""
    text = str(exc)
    return not te_findable() and any(k in text for k in ("TE ", "TE>", "Transformer Engine", "transformer_engine",
                                                         "TransformerEngine", "install TE"))


class MegatronRefusal(UsageError):
    """Megatron-LM's parser or validate_args refuses a line: `stage` (`parser`, `validate_args`, `placement`) and
    what Megatron said."""

    def __init__(self, message: str, *, stage: str = "", said: str = "") -> None:
        super().__init__(message)
        self.stage, self.said = stage, said or message

    @classmethod
    def of(cls, stage: str, said: str) -> MegatronRefusal:
        """The refusal at `stage` with Megatron's words."""
        what = {"parser": "Megatron-LM's parser refuses the line",
                "validate_args": "Megatron-LM's validate_args refuses the line"}.get(stage)
        return cls(f"{what}: {said}" if what else said, stage=stage, said=said)


def megatron_args(line: MegatronLine, *, world_size: int, capability: tuple[int, int] | None = None,
                  ) -> tuple[Any, tuple[str, ...]]:
    """Megatron-LM's parse_args and validate_args on the line, for `world_size` processes.

    Returns:
        (the validated argparse Namespace, Megatron's warnings as notes).

    Raises:
        MegatronRefusal: the parser refuses a flag or a value, validate_args refuses the settings (Megatron's
            message), or the line's model parallelism does not fit `world_size` (the placement it needs).
        MissingDependencyError: megatron.training does not import.
    """
    _, args, notes = parse_and_validate(line, world_size=world_size, capability=capability)
    return args, notes


def parse_and_validate(line: MegatronLine, *, world_size: int | None = None,
                       capability: tuple[int, int] | None = None) -> tuple[Any, Any, tuple[str, ...]]:
    """Megatron-LM's parse_args, then validate_args, on the line (with the flags its script adds) for `world_size`
    processes (None: the fewest the line's model parallelism fits, smallest_world).

    Returns:
        (the parsed Namespace as validate_args got it, the validated one, Megatron's warnings as notes).

    Raises:
        MegatronRefusal: as megatron_args.
        MissingDependencyError: megatron.training does not import.
    """
    import copy

    arguments = training_arguments()
    capability = capability or DEFAULT_CAPABILITY
    with _megatron_process(line.argv(), world_size or 1, line.env, capability) as (caught, errors):
        try:
            args = arguments.parse_args(extra_args_provider=lambda parser: add_script_flags(parser, line.script))
        except SystemExit:
            said = [x for x in errors.getvalue().strip().splitlines() if x.strip()]
            raise MegatronRefusal.of("parser", said[-1].split("error: ", 1)[-1] if said else "it refused the line") \
                from None
        except MEGATRON_ERRORS as exc:
            raise MegatronRefusal.of("parser", megatron_message(exc)) from None
        if world_size is None:
            world_size = args.world_size = smallest_world(args)
        _check_fits(args, world_size)
        given = copy.deepcopy(args)
        try:
            # The inference scripts set up under torch's inference mode, which validate_args reads (--fp8-param-gather)
            with torch_grad(line.script != "inference"):
                arguments.validate_args(args, {})
        except MEGATRON_ERRORS as exc:
            raise MegatronRefusal.of("validate_args", megatron_message(exc)) from None
    notes = tuple(dict.fromkeys(f"Megatron-LM: {str(w.message).strip().splitlines()[0][:200]}" for w in caught
                                if w.filename.replace(os.sep, "/").find("megatron/training") >= 0
                                and str(w.message).strip()))
    return given, args, notes


def torch_grad(enabled: bool) -> Any:
    """torch.set_grad_enabled(enabled), imported when asked."""
    import torch

    return torch.set_grad_enabled(enabled)


def torchrun_counts(line: MegatronLine) -> tuple[int, int] | None:
    """(--nproc-per-node, --nnodes) of the line's torchrun, when both are plain numbers (--nnodes defaults to 1)."""
    counts = []
    for flag, default in (("--nproc-per-node", None), ("--nnodes", ("1",))):
        given = line.launcher.get(flag, default)
        if not given or not str(given[0]).isdigit():
            return None
        counts.append(int(given[0]))
    return counts[0], counts[1]


def smallest_world(args: Any) -> int:
    """The fewest processes the parsed line's model parallelism (tensor x pipeline x context, and the experts'
    expert x expert-tensor x pipeline) fits."""
    import math

    model = args.tensor_model_parallel_size * args.pipeline_model_parallel_size * args.context_parallel_size
    expert = args.expert_model_parallel_size * (args.expert_tensor_parallel_size or args.tensor_model_parallel_size) \
        * args.pipeline_model_parallel_size
    return math.lcm(model, expert)


def _check_fits(args: Any, world_size: int) -> None:
    """The line's model parallelism fits the processes diff starts (validate_args would only say 'not divisible')."""
    sizes = {"tensor": args.tensor_model_parallel_size, "pipeline": args.pipeline_model_parallel_size,
             "context": args.context_parallel_size}
    model = sizes["tensor"] * sizes["pipeline"] * sizes["context"]
    expert = args.expert_model_parallel_size * (args.expert_tensor_parallel_size or args.tensor_model_parallel_size)
    need = max(model, expert)
    if world_size % model == 0 and world_size % expert == 0:
        return
    parts = " x ".join(f"{name} {size}" for name, size in sizes.items() if size > 1) or "1"
    if args.expert_model_parallel_size > 1:
        parts += f", expert {args.expert_model_parallel_size}"
    raise MegatronRefusal.of("placement", f"placement: the line's model parallelism ({parts}) needs a multiple of {need} processes, "
                     f"diff starts {world_size}; give --fit to shrink every placement to the GPUs at hand, or "
                     f"--nproc-per-node {need}")


def describe_args(args: Any, line: MegatronLine, *, source: str,
                  transformer: Mapping[str, Any] | None = None) -> ModelDescription:
    """The model Megatron-LM builds from validated args: core_transformer_config_from_args, then
    gpt_config_from_args (hybrid_config_from_args with --hybrid-layer-pattern); `transformer` (TransformerConfig
    fields of a run file) replaces fields of the TransformerConfig before the model config is made.

    Where the TransformerConfig refuses the settings because Transformer Engine is not installed here, the model
    is described from Megatron-LM's values without its checks and marked `unavailable`: a plan says so for its
    rows, a run refuses it (graphdoctor.parent.static).

    Raises:
        UsageError: the TransformerConfig refuses the settings (Megatron's message).
    """

    spec = ":".join(args.spec[:2]) if args.spec else None
    args.spec = None  # carried by name (layer_spec); graphdoctor.config.build imports it, from Megatron only
    unavailable = None
    try:
        tconfig, model = _model_configs(args, transformer, None)
    except MEGATRON_ERRORS as exc:
        if not needs_te(exc):
            raise UsageError(f"Megatron's TransformerConfig refuses the line: {megatron_message(exc)}") from None
        unavailable = f"the model needs Transformer Engine, which is not installed here (Megatron: " \
                      f"{megatron_message(exc)})"
        tconfig, model = _model_configs(args, transformer, unavailable)
    return describe_model(tconfig, model, source=source, layer_spec=spec, te_rng_tracker=bool(args.te_rng_tracker),
                          line=line.groups, unavailable=unavailable)


def _model_configs(args: Any, transformer: Mapping[str, Any] | None, unvalidated: str | None) -> tuple[Any, Any]:
    """Megatron-LM's TransformerConfig and model config of validated args (the TransformerConfig's own checks
    skipped when `unvalidated` says why they cannot pass here)."""
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.training.argument_utils import (
        core_transformer_config_from_args,
        gpt_config_from_args,
        hybrid_config_from_args,
    )

    cls = MLATransformerConfig if args.multi_latent_attention else TransformerConfig
    if unvalidated is not None:
        cls = unvalidated_class(cls)
        args = argparse.Namespace(**{**vars(args), "multi_latent_attention": False,
                                     "heterogeneous_layers_config_path": None})
    with warnings.catch_warnings(), _quiet_logging():
        warnings.simplefilter("ignore")
        tconfig = core_transformer_config_from_args(args, config_class=cls)
        if transformer:
            tconfig = replace(tconfig, **transformer)
        if args.hybrid_layer_pattern is not None:
            return tconfig, hybrid_config_from_args(args, tconfig)
        return tconfig, gpt_config_from_args(args, tconfig)


def _args_read(function: Any) -> set[str]:
    """The `args.<name>` attributes (and getattr(args, 'name')) a Megatron function reads."""
    tree = ast.parse(inspect.getsource(function))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
            names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == "args" \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            names.add(node.args[1].value)
    return names


@cache
def model_dests() -> frozenset[str]:
    """The Megatron-LM settings the model is built from: TransformerConfig's (and MLATransformerConfig's) fields,
    which Megatron-LM copies by name, and what core_transformer_config_from_args, gpt_config_from_args and
    hybrid_config_from_args read besides (read from their source, so a new release's settings count)."""
    import dataclasses

    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.training import argument_utils

    names = {f.name for cls in (TransformerConfig, MLATransformerConfig) for f in dataclasses.fields(cls)}
    for function in (argument_utils.core_transformer_config_from_args, argument_utils.gpt_config_from_args,
                     argument_utils.hybrid_config_from_args, argument_utils._apply_yarn_config_from_args):
        names |= _args_read(function)
    return frozenset(names)


NOT_APPLIED_WHY = ("diff trains synthetic batches in its own loop (Adam, lr 1e-3, no schedule), logs nothing and "
                   "writes no checkpoints")


def not_applied(line: MegatronLine) -> str | None:
    """The one note naming the flags that do not reach diff's runs, by Megatron-LM's argument group."""
    table = megatron_flags(line.script)
    used = model_dests() | RUN_DESTS | GRAPH_DESTS
    by_group: dict[str, list[str]] = {}
    for flag in line.flags():
        spec: MegatronFlag = table[flag]
        if spec.dest not in used:
            by_group.setdefault(spec.group or "other", []).append(flag)
    launcher = [f for f in line.launcher if f not in ("--nproc-per-node", "--nnodes")]
    if launcher:
        by_group.setdefault("launcher (torchrun)", []).extend(launcher)
    if not by_group:
        return None
    parts = "; ".join(f"{group}: {', '.join(flags)}" for group, flags in by_group.items())
    return f"flags that do not apply ({NOT_APPLIED_WHY}): {parts}"


__all__ = ["DEFAULT_CAPABILITY", "GRAPH_DESTS", "LAUNCH_SCRIPT", "RUN_DESTS", "MegatronLine", "MegatronRefusal",
           "dest_values", "parse_and_validate", "smallest_world", "torchrun_counts",
           "describe_args", "flag_group", "megatron_args", "megatron_message", "model_dests", "needs_te",
           "not_applied", "read_uses", "with_values"]
