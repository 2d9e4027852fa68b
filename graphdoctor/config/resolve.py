"""The one resolve: a run's sources -> one DiffConfig, and the model it builds.

The sources, highest first: explicit values (flags, the Python API), the run file's `run:`, its `transformer:`,
then the model's own description, one of: a Megatron-LM launch line or shell script (`--megatron-args`, or
`run.megatron_args`), a Megatron-LM functional test's model_config.yaml, a Megatron-Bridge ConfigContainer YAML
(`--config`). A Megatron source is resolved by Megatron's own code (graphdoctor.config.from_megatron) with the
values above put in as its settings; without one the model is graphdoctor's own GPT model
(DiffConfig.model.builtin, derived by DiffConfig itself).
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from graphdoctor.config.bridge import BridgeConfig
from graphdoctor.config.diff_config import GRAPH_FIELDS, DiffConfig
from graphdoctor.config.from_megatron import resolve_bridge, resolve_line
from graphdoctor.config.functional_test import FunctionalTest, is_functional_test, read_functional_test
from graphdoctor.config.graph_settings import graph_choice
from graphdoctor.config.impl import MEGATRON_EAGER
from graphdoctor.config.launch_scan import scan_launch
from graphdoctor.config.megatron_line import read_uses
from graphdoctor.config.run_file import RunFile
from graphdoctor.config.schema import load_yaml_strict
from graphdoctor.config.twins import BY_FIELD, OWNED, getter, read_twins
from graphdoctor.errors import UsageError, where_from
from graphdoctor.inputs import describe, read_text

LIST_FIELDS: tuple[str, ...] = ("impls", "allow_env", "cuda_graph_modules", "recompute_modules")
"""DiffConfig fields given as a comma-separated string on the command line."""


def _as_tuple(key: str, value: Any) -> tuple[Any, ...]:
    if isinstance(value, str):
        value = [s.strip() for s in value.split(",") if s.strip()]
    if not isinstance(value, list | tuple):
        raise UsageError(f"{key}: got {describe(value)}, expected a list of names")
    return tuple(value)


def diff_config_from(run_file: RunFile | None, **overrides: Any) -> DiffConfig:
    """Build a DiffConfig from the run's sources (the module docstring's order).

    Raises:
        UsageError: a value of the wrong type or range (the message names the field), or a setting Megatron
            refuses (its message).
        InputFileError: an unreadable launch-line or functional-test file.
        MissingDependencyError: a Megatron source without megatron.training, or a model that needs Transformer
            Engine where it is not installed.
    """
    values: dict[str, Any] = {}
    if run_file is not None:
        values.update(run_file.run)
        values["transformer"] = dict(run_file.transformer)
        values["env"] = dict(run_file.env)
    given = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(given.get("transformer"), dict) and run_file is not None:
        given["transformer"] = {**run_file.transformer, **given["transformer"]}  # fields over the run file's
    values.update(given)
    for key in LIST_FIELDS:
        if key in values:
            values[key] = _as_tuple(key, values[key])
    field_types = {f.name: f.type for f in dataclasses.fields(DiffConfig)}
    for key, value in values.items():
        _check_type(key, value, str(field_types.get(key, "")))
    if values.get("transformer"):
        _fill_from_transformer(values, f"{run_file.path}: " if run_file is not None else "")
    source = run_file.source if run_file is not None else None
    if isinstance(source, BridgeConfig):
        values = resolve_bridge(values, source)
    elif isinstance(source, FunctionalTest) or values.get("megatron_args") is not None:
        from_file = run_file is not None and overrides.get("megatron_args") is None
        where = f"{run_file.path}: run.megatron_args" if run_file is not None and from_file and \
            values.get("megatron_args") else None
        with where_from(where) if where else contextlib.nullcontext():
            values = _resolve_megatron_lm(values, source)
    try:
        return DiffConfig(**values)
    except TypeError as exc:
        raise UsageError(str(exc)) from None


def _resolve_megatron_lm(values: dict[str, Any], test: FunctionalTest | None) -> dict[str, Any]:
    """A launch line (text, `@script`, `@model_config.yaml`) or a functional test read by Megatron-LM."""
    text = values.get("megatron_args")
    if text is not None:
        test = read_megatron_file(str(text)) or test
    if test is not None and (text is None or str(text).startswith("@")):
        over = split_at_file(str(text))[1] if text is not None else ""
        uses = [*test.uses, *(scan_launch(over)[0] if over else [])]
        values["env"] = {**test.env, **values.get("env", {})}
        return resolve_line(values, read_uses(uses, env=values["env"]), f"functional test {test.path}")
    path, extra = split_at_file(str(text))
    uses, exported = scan_launch(path if path else str(text))
    if path and extra:
        uses += scan_launch(extra)[0]  # flags after the file go over its own, as argparse keeps the last
    values["env"] = {**exported, **values.get("env", {})}
    line = read_uses(uses, env=values["env"])
    label = path[1:] if path else "--megatron-args"
    return resolve_line(values, line, f"launch line {label}")


def split_at_file(text: str) -> tuple[str | None, str]:
    """`@FILE --flag v ...` -> ("@FILE", "--flag v ..."): a launch file, then flags over it; ("@FILE", "") for a file
    alone (its name may hold spaces), (None, text) for a line."""
    if not text.startswith("@"):
        return None, text
    if Path(text[1:]).exists() or " " not in text.strip():
        return text, ""
    head, _, rest = text.partition(" ")
    return head, rest.strip()


def read_megatron_file(text_or_at: str) -> FunctionalTest | None:
    """The functional test an `@FILE` names when the file is one (a YAML file with MODEL_ARGS); None otherwise.

    Raises:
        InputFileError: an unreadable or malformed YAML file.
    """
    at, _ = split_at_file(text_or_at)
    if at is None or Path(at[1:]).suffix not in (".yaml", ".yml"):
        return None
    path = at[1:]
    data, lines = load_yaml_strict(read_text(path, "functional test"), path)
    return read_functional_test(path, data, lines) if is_functional_test(data) else None


def _fill_from_transformer(values: dict[str, Any], where: str) -> None:
    """Fill the DiffConfig fields a `transformer:` mapping sets, where `run:` and the flags do not, as a launch line
    sets them from the same Megatron settings: the twins the run owns (config.twins, `transformer=True`: the
    same-name fields; `dropout`, the larger of hidden_dropout and attention_dropout, since diff applies one to
    both, as for a launch line; `dtype` from bf16/fp16) and `layer_spec` from transformer_impl; `impls` and
    `cuda_graph_modules` from the graph settings, which then leave the mapping (GRAPH_FIELDS). Called before the launch line is applied: the run file sits over it.

    Raises:
        UsageError: graph settings Megatron refuses (graph_settings.graph_choice), named `<where>transformer.<field>`.
    """
    transformer = dict(values["transformer"])
    for name, value in read_twins(getter(transformer), (*OWNED, BY_FIELD["layer_spec"])).items():
        values.setdefault(name, value)
    if any(name in transformer for name in GRAPH_FIELDS):
        settings = graph_choice(transformer.get, lambda name: f"{where}transformer.{name}")
        if settings.legacy_with_impl:
            raise UsageError(f"{where}transformer.enable_cuda_graph: expected it, or external_cuda_graph, without "
                             f"cuda_graph_impl {settings.impl} (TransformerConfig refuses the pair)")
        if settings.impl != MEGATRON_EAGER:
            values.setdefault("impls", (settings.impl,))
        if settings.modules:
            values.setdefault("cuda_graph_modules", settings.modules)
        values["transformer"] = {k: v for k, v in transformer.items() if k not in GRAPH_FIELDS}


def _check_type(key: str, value: Any, annotation: str) -> None:
    expected: tuple[type, ...]
    if annotation in ("int", "int | None"):
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (value is None and "None" in annotation)
        what = "an integer"
    elif annotation == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        what = "a number"
    elif annotation in ("bool", "bool | None"):
        ok = isinstance(value, bool) or (value is None and "None" in annotation)
        what = "true or false"
    elif annotation.startswith("str"):
        expected = (str, type(None)) if "None" in annotation else (str,)
        ok = isinstance(value, expected)
        what = "a string"
    else:
        return
    if not ok:
        raise UsageError(f"{key}: got {describe(value)} ({type(value).__name__}), expected {what}")




__all__ = ["LIST_FIELDS", "diff_config_from", "read_megatron_file", "split_at_file"]
