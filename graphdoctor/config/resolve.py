"""The one resolve: a run's sources (flags, run file, launch line) -> one DiffConfig.

Explicit values win, then the run file's `run:`, then its `transformer:`, then the launch line.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from graphdoctor.config.diff_config import GRAPH_FIELDS, TRANSFORMER_TWINS, DiffConfig
from graphdoctor.config.run_file import RunFile
from graphdoctor.errors import UsageError, where_from
from graphdoctor.inputs import describe


def diff_config_from(run_file: RunFile | None, **overrides: Any) -> DiffConfig:
    """Build a DiffConfig: defaults, then the launch line of `megatron_args` (run file or flag), then the
    run file's `run:` and `transformer:`, then explicit overrides (flags).

    Raises:
        UsageError: a value of the wrong type or range (the message names the field).
    """
    values: dict[str, Any] = {}
    if run_file is not None:
        values.update(run_file.run)
        values["transformer"] = dict(run_file.transformer)
        values["env"] = dict(run_file.env)
    values.update({k: v for k, v in overrides.items() if v is not None})
    if values.get("transformer"):
        _fill_from_transformer(values, f"{run_file.path}: " if run_file is not None else "")
    if values.get("megatron_args") is not None:
        # The launch line sits under the run file and the flags (graphdoctor.config.launch_line).
        from graphdoctor.config.launch_line import apply_launch_line

        from_file = run_file is not None and overrides.get("megatron_args") is None
        source = f"{run_file.path}: run.megatron_args" if run_file is not None and from_file else None
        with where_from(source) if source else contextlib.nullcontext():
            values = apply_launch_line(values)
    if "impls" in values:
        impls = values["impls"]
        if isinstance(impls, str):
            impls = [s.strip() for s in impls.split(",") if s.strip()]
        if not isinstance(impls, (list, tuple)):
            raise UsageError(f"impls: got {describe(impls)}, expected a list of implementation names")
        values["impls"] = tuple(impls)
    if "allow_env" in values:
        allowed = values["allow_env"]
        if isinstance(allowed, str):
            allowed = [s.strip() for s in allowed.split(",") if s.strip()]
        if not isinstance(allowed, (list, tuple)):
            raise UsageError(f"allow_env: got {allowed!r}, expected a list of variable names")
        values["allow_env"] = tuple(allowed)
    for key in ("cuda_graph_modules", "recompute_modules"):
        if key not in values:
            continue
        mods = values[key]
        if isinstance(mods, str):
            mods = [s.strip() for s in mods.split(",") if s.strip()]
        if not isinstance(mods, (list, tuple)):
            raise UsageError(f"{key}: got {describe(mods)}, expected a list of module names")
        values[key] = tuple(mods)
    field_types = {f.name: f.type for f in dataclasses.fields(DiffConfig)}
    for key, value in values.items():
        _check_type(key, value, str(field_types.get(key, "")))
    try:
        return DiffConfig(**values)
    except TypeError as exc:
        raise UsageError(str(exc)) from None


def _fill_from_transformer(values: dict[str, Any], where: str) -> None:
    """Fill the DiffConfig fields a `transformer:` mapping sets, where `run:` and the flags do not, as a launch line
    sets them from the same Megatron settings (graphdoctor.config.launch_line): the TRANSFORMER_TWINS; `dropout`, the
    larger of hidden_dropout and attention_dropout (diff applies one to both, as for a launch line); `dtype` from
    bf16/fp16; `layer_spec` from transformer_impl; `impls` and `cuda_graph_modules` from the graph settings, which
    then leave the mapping (GRAPH_FIELDS). Called before the launch line is applied: the run file sits over it.

    Raises:
        UsageError: graph settings Megatron refuses (launch_line.graph_choice), named `<where>transformer.<field>`.
    """
    from graphdoctor.config.launch_line import graph_choice

    transformer = dict(values["transformer"])
    for name in TRANSFORMER_TWINS:
        if name in transformer:
            values.setdefault(name, transformer[name])
    dropouts = [transformer[k] for k in ("hidden_dropout", "attention_dropout") if k in transformer]
    if dropouts and all(isinstance(d, int | float) and not isinstance(d, bool) for d in dropouts):
        values.setdefault("dropout", max(dropouts))
    for flag in ("bf16", "fp16"):
        if transformer.get(flag) is True:
            values.setdefault("dtype", flag)
    if transformer.get("transformer_impl") in ("local", "transformer_engine"):
        values.setdefault("layer_spec", "local" if transformer["transformer_impl"] == "local" else "te")
    if any(name in transformer for name in GRAPH_FIELDS):
        settings = graph_choice(transformer.get, lambda name: f"{where}transformer.{name}")
        if settings.legacy_with_impl:
            raise UsageError(f"{where}transformer.enable_cuda_graph: expected it, or external_cuda_graph, without "
                             f"cuda_graph_impl {settings.impl} (TransformerConfig refuses the pair)")
        if settings.impl != "none":
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




__all__ = ["diff_config_from"]
