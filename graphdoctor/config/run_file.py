"""The file of `--config` (and of `check`'s inputs), read strictly and validated on load: graphdoctor's run file
(`transformer:`, `env:`, `run:`), a Megatron-LM functional test's model_config.yaml (MODEL_ARGS, ENV_VARS) or a
Megatron-Bridge ConfigContainer YAML, told apart by their sections.

One file feeds both `graphdoctor diff --config` and `graphdoctor check`, with one schema
(graphdoctor.config.schema): strict YAML, plain values, common ranges; a non-empty `transformer:`
section is type-checked against megatron-core's TransformerConfig (imported for that only).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphdoctor.config.bridge import BridgeConfig, is_bridge_config, read_bridge
from graphdoctor.config.diff_config import DiffConfig
from graphdoctor.config.functional_test import FunctionalTest, is_functional_test, read_functional_test
from graphdoctor.config.megatron_lm import validate_transformer
from graphdoctor.config.schema import load_yaml_strict, validate_section
from graphdoctor.errors import InputFileError, UsageError
from graphdoctor.inputs import describe, read_text
from graphdoctor.suggest import did_you_mean

RUN_FILE_SECTIONS: tuple[str, ...] = ("transformer", "env", "run")

MAX_RUN_FILE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class RunFile:
    """The parsed run file: three optional mappings."""

    path: str
    """Where it was read from (for messages)."""

    transformer: dict[str, Any]
    """TransformerConfig field name -> value."""

    env: dict[str, str]
    """Environment variable -> value."""

    run: dict[str, Any]
    """graphdoctor run field (a DiffConfig field) -> value."""

    source: FunctionalTest | BridgeConfig | None = None
    """The model's own description when the file is a functional test or a Megatron-Bridge config (its
    `transformer:` and `run:` are then empty, its `env:` the file's)."""

    @property
    def kind(self) -> str:
        """`run-file`, `functional-test` or `bridge`."""
        if isinstance(self.source, FunctionalTest):
            return "functional-test"
        return "bridge" if isinstance(self.source, BridgeConfig) else "run-file"


def _functional_test_with_repeats(text: str, where: str, refused: InputFileError, repeated: list[str],
                                  ) -> tuple[Any, dict[int, dict[str, int]]]:
    """A functional test whose MODEL_ARGS repeat a flag, read as Megatron-LM's harness reads it: yq passes every
    entry and Megatron-LM's parser keeps the last (Megatron-LM's own test cases repeat flags); anything else with
    a duplicate key stays refused.

    Raises:
        InputFileError: `refused`, unless the file is a functional test.
    """
    if "duplicate key" not in str(refused):
        raise refused
    data, lines = load_yaml_strict(text, where, repeated)
    if not is_functional_test(data):
        raise refused
    return data, lines


def load_run_file(path: str | os.PathLike[str]) -> RunFile:
    """Read and validate a run file (YAML; JSON is valid YAML too).

    Args:
        path: the file.

    Returns:
        The parsed RunFile; keys are checked for shape, `run:` keys against DiffConfig fields,
        `transformer:` values against TransformerConfig's types, every value for NaN/infinity,
        64-bit integers and the ranges of graphdoctor.config.schema.

    Raises:
        InputFileError: not a regular file, over 1 MiB, bad YAML, a duplicate key (with its line),
            a document too deep or too large once aliases expand, or a section of the wrong type.
        UsageError: an unknown `run:` key or top-level section, or a value of the wrong type or range.
    """
    p = Path(path)
    text = read_text(p, "run file", max_bytes=MAX_RUN_FILE_BYTES)
    repeated: list[str] = []
    try:
        data, lines = load_yaml_strict(text, str(p))
    except InputFileError as refused:
        data, lines = _functional_test_with_repeats(text, str(p), refused, repeated)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputFileError(f"{p}: expected a mapping with transformer:/env:/run:, got {describe(data)}")
    if is_functional_test(data):
        test = read_functional_test(p, data, lines, repeated=tuple(repeated))
        return RunFile(path=str(p), transformer={}, env=dict(test.env), run={}, source=test)
    if is_bridge_config(data):
        bridge = read_bridge(p, data, lines)
        return RunFile(path=str(p), transformer={}, env=dict(bridge.env), run={}, source=bridge)
    unknown = sorted(set(map(str, data)) - set(RUN_FILE_SECTIONS))
    if unknown:
        raise UsageError(
            f"{p}: unknown section {describe(unknown[0])}{did_you_mean(str(unknown[0]), RUN_FILE_SECTIONS)}, "
            f"expected one of {', '.join(RUN_FILE_SECTIONS)} (or a functional test's MODEL_ARGS, or a "
            "Megatron-Bridge ConfigContainer with model:)"
        )
    sections: dict[str, dict[str, Any]] = {}
    for name in RUN_FILE_SECTIONS:
        value = data.get(name) or {}
        if not isinstance(value, dict):
            raise InputFileError(f"{p}: section {name!r} must be a mapping, got {describe(value)}")
        for key in value:
            if not isinstance(key, str):
                raise InputFileError(f"{p}: {name}: key {describe(key)} must be a string")
        validate_section(name, value, str(p), lines.get(id(value), {}))
        sections[name] = dict(value)
    env = {}
    for key, value in sections["env"].items():
        if isinstance(value, (dict, list)):
            raise InputFileError(f"{p}: env.{key} must be a scalar, got {describe(value)}")
        env[key] = "" if value is None else str(value)
    run_fields = {f.name for f in dataclasses.fields(DiffConfig)} - {"transformer", "env", "launch_notes"}
    for key in sections["run"]:
        if key not in run_fields:
            raise UsageError(f"{p}: run.{key[:100]} is not a graphdoctor run field"
                             f"{did_you_mean(str(key), run_fields)} (see `graphdoctor diff --help`)")
    if sections["transformer"]:
        # The same TransformerConfig types for `check` and `diff` (imports megatron-core, CPU only;
        # diff needs it anyway): offload_modules: [[1]] fails here, before any GPU work.
        validate_transformer(sections["transformer"], str(p))
    return RunFile(path=str(p), transformer=sections["transformer"], env=env, run=sections["run"])


__all__ = ["MAX_RUN_FILE_BYTES", "RUN_FILE_SECTIONS", "RunFile", "load_run_file"]
