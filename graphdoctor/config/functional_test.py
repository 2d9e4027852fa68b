"""A Megatron-LM functional-test `model_config.yaml` (tests/functional_tests/test_cases/*/*/): ENV_VARS, and
MODEL_ARGS turned into flags the way Megatron-LM's own harness turns them
(tests/functional_tests/shell_test_utils/_run_training.sh): `true` is the bare flag, a value in `[ ]` is its
items, a value in `( )` or with spaces or `|` is one word, anything else the word itself; `${VAR}` values the
file does not set are left out, as the launch-line reader leaves them.

Read with the run file's strict YAML (duplicate keys, depth and size bounded); nothing in it runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphdoctor.config.launch_scan import FlagUse
from graphdoctor.config.schema import loaded_yaml
from graphdoctor.errors import InputFileError
from graphdoctor.inputs import describe

MAX_FUNCTIONAL_TEST_BYTES = 1 << 20
MODES: tuple[str, ...] = ("training", "pretraining", "inference", "rl")
"""The harness's MODE values (tests/functional_tests/python_test_utils; `pretraining` is `training`)."""
_VARIABLE = re.compile(r"\$\{?[A-Za-z_]\w*\}?")


@dataclass(frozen=True, slots=True)
class FunctionalTest:
    """What a functional-test file sets for a run."""

    path: str
    uses: tuple[FlagUse, ...]
    """MODEL_ARGS as flag uses, with their lines (`model_config.yaml:12`)."""
    env: dict[str, str]
    """ENV_VARS."""
    mode: str = "training"
    """What the harness runs (its MODE): `training` (pretrain_gpt.py; no MODE), `inference` (the inference
    examples, with megatron/inference/utils.py's flags) or `rl` (train_rl.py)."""
    notes: tuple[str, ...] = ()
    """What reading the file noticed (MODEL_ARGS keys it repeats)."""


def is_functional_test(data: Any) -> bool:
    """A mapping with MODEL_ARGS (the harness's format)."""
    return isinstance(data, Mapping) and isinstance(data.get("MODEL_ARGS"), Mapping)


def _words(value: Any) -> list[str]:
    """The harness's words for one MODEL_ARGS value."""
    text = str(value).strip()
    if re.fullmatch(r"\[[^\]]+\]", text):
        return text[1:-1].split()
    return [text]


def _use(flag: str, value: Any, where: str) -> FlagUse:
    if value is True:
        return FlagUse(flag=flag, values=(), where=where)
    words = _words("" if value is None else value)
    unresolved = tuple(w for w in words if _VARIABLE.search(w))
    if unresolved:
        return FlagUse(flag=flag, values=(), where=where, unresolved=unresolved)
    return FlagUse(flag=flag, values=tuple(w for w in words if w), where=where)


def read_functional_test(path: str | Path, data: Any = None, lines: Mapping[int, Mapping[str, int]] | None = None,
                         *, repeated: tuple[str, ...] = ()) -> FunctionalTest:
    """Read a functional-test file (or its already-loaded YAML `data` with the loader's `lines`, and the keys the
    loader found `repeated`, graphdoctor.config.run_file).

    Raises:
        InputFileError: unreadable, bad YAML, no MODEL_ARGS mapping, a key that is not a flag, an ENV_VARS value
            that is not a scalar.
    """
    where = str(path)
    data, lines = loaded_yaml(path, "functional test", MAX_FUNCTIONAL_TEST_BYTES, data, lines)
    if not is_functional_test(data):
        raise InputFileError(f"{where}: expected a functional test's MODEL_ARGS mapping")
    args: Mapping[str, Any] = data["MODEL_ARGS"]
    arg_lines = lines.get(id(args), {})
    uses: list[FlagUse] = []
    for key, value in args.items():
        flag = str(key)
        if not flag.startswith("--"):
            raise InputFileError(f"{where}:{arg_lines.get(flag, '?')}: MODEL_ARGS key {describe(flag)} is not a "
                                 "Megatron-LM flag (expected --name)")
        if isinstance(value, Mapping | list) or value is False:
            raise InputFileError(f"{where}:{arg_lines.get(flag, '?')}: MODEL_ARGS.{flag}: got {describe(value)}, "
                                 "expected true or a value (the harness passes nothing else)")
        uses.append(_use(flag, value, f"{where}:{arg_lines.get(flag, '?')}"))
    env_section = data.get("ENV_VARS") or {}
    if not isinstance(env_section, Mapping):
        raise InputFileError(f"{where}: ENV_VARS must be a mapping, got {describe(env_section)}")
    env: dict[str, str] = {}
    for key, value in env_section.items():
        if isinstance(value, Mapping | list):
            raise InputFileError(f"{where}: ENV_VARS.{key} must be a scalar, got {describe(value)}")
        env[str(key)] = "" if value is None else str(value)
    mode = str(data.get("MODE") or "training").strip().lower()
    if mode not in MODES:
        raise InputFileError(f"{where}: MODE {describe(data.get('MODE'))} is not one Megatron-LM's harness runs "
                             f"(expected {', '.join(MODES)})")
    mode = "training" if mode == "pretraining" else mode
    notes: tuple[str, ...] = ()
    if repeated:
        notes = (f"MODEL_ARGS repeats {', '.join(repeated)}: the harness passes each, Megatron-LM's parser keeps the "
                 "last",)
    return FunctionalTest(path=where, uses=tuple(uses), env=env, mode=mode, notes=notes)


__all__ = ["MAX_FUNCTIONAL_TEST_BYTES", "MODES", "FunctionalTest", "is_functional_test",
           "read_functional_test"]
