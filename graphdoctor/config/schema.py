"""Strict YAML for run files and the value rules shared by `check` and `diff`.

A run file is read once, by config.load_run_file, for both commands: duplicate keys are refused
with their line, values are plain (no NaN or infinity, bounded integers, strings, lists and
nesting, YAML aliases that expand past a bound refused), and the common TransformerConfig fields
have the same ranges as DiffConfig. Errors name the file, the line and the field.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

from graphdoctor.errors import InputFileError, UsageError
from graphdoctor.inputs import check_tree, describe, describe_error, read_text

MAX_RUN_FILE_VALUES = 100_000
"""Values a run file may hold once YAML aliases are expanded (a hand-written file has hundreds)."""
MAX_RUN_FILE_DEPTH = 16
MAX_STRING_CHARS = 4096
MAX_LIST_ITEMS = 4096
MAX_ABS_INT = 1 << 63

POSITIVE_INT_FIELDS = frozenset({
    "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "kv_channels", "num_query_groups",
    "moe_router_topk", "moe_ffn_hidden_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "seq_length", "micro_batch_size",
    "num_microbatches", "vocab_size", "steps", "eval_iters", "nproc_per_node", "ddp_bucket_size",
})
"""Fields that count something: an integer >= 1 (None allowed where TransformerConfig defaults to None)."""
NON_NEGATIVE_INT_FIELDS = frozenset({"num_moe_experts", "cuda_graph_warmup_steps", "seed", "recompute_num_layers", "eval_interval", "save_at",
                                     "cpu_offloading_num_layers"})
VARIABLE_RUN_FIELDS = frozenset({"seq_length", "micro_batch_size"})
"""`run:` fields `check` also takes as several values (a list, or `variable`; rule GD403)."""
PROBABILITY_FIELDS = frozenset({"hidden_dropout", "attention_dropout", "dropout"})
"""Dropout probabilities: a number in [0, 1)."""
POSITIVE_NUMBER_FIELDS = frozenset({"loss_scale"})
"""Scales: a number > 0 (fp16's static loss scale; None: unset)."""


def load_yaml_strict(text: str, where: str, repeated: list[str] | None = None) -> tuple[Any, dict[int, dict[str, int]]]:
    """safe_load with duplicate keys refused; also returns id(mapping) -> {key: 1-based line}.

    With a `repeated` list, a duplicate key is not refused: the later value is kept (as a parser taking the flags in
    order keeps the last) and `key (lines A and B)` is appended to the list.

    Raises:
        InputFileError: bad YAML, a duplicate key (with its line), or a document too deep or
            too large once aliases are expanded.
    """
    import yaml

    _check_flow_depth(text, where)
    lines: dict[int, dict[str, int]] = {}

    class _StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
                line = key_node.start_mark.line + 1
                if key in seen and repeated is not None:
                    repeated.append(f"{key} (lines {seen[key]} and {line})")
                elif key in seen:
                    raise InputFileError(f"{where}:{line}: duplicate key {describe(key)} (first at line {seen[key]})")
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    def construct_map(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
        data: dict[Any, Any] = {}
        yield data
        data.update(loader.construct_mapping(node))
        lines[id(data)] = {str(k.value): k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}

    _StrictLoader.add_constructor("tag:yaml.org,2002:map", construct_map)

    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputFileError(f"{where}: not valid YAML{at} ({describe_error(getattr(exc, 'problem', None) or exc)})") \
            from None
    except InputFileError:
        raise
    except RecursionError:
        raise InputFileError(f"{where}: nested too deeply for a run file") from None
    except (ValueError, OverflowError) as exc:
        raise InputFileError(f"{where}: a value YAML cannot convert ({describe_error(exc)})") from None
    check_tree(data, where, max_nodes=MAX_RUN_FILE_VALUES, max_depth=MAX_RUN_FILE_DEPTH)
    return data, lines


def loaded_yaml(path: str | os.PathLike[str], what: str, max_bytes: int, data: Any = None,
                lines: Mapping[int, Mapping[str, int]] | None = None) -> tuple[Any, Mapping[int, Mapping[str, int]]]:
    """`data` and its `lines` as the caller already loaded them (load_yaml_strict), or the file read strictly.

    Raises:
        InputFileError: as read_text and load_yaml_strict.
    """
    if data is None:
        return load_yaml_strict(read_text(path, what, max_bytes=max_bytes), str(path))
    return data, lines or {}


_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_MAX_FLOW_DEPTH = 4 * MAX_RUN_FILE_DEPTH


def _check_flow_depth(text: str, where: str) -> None:
    """Refuse deeply nested flow collections before PyYAML's scanner, which is quadratic in them
    (3 s for `[` * 1000). Brackets inside quoted strings count too, hence the generous bound."""
    depth = deepest = 0
    for char in _NOT_BRACKETS.sub("", text):
        depth = depth + 1 if char in "[{" else max(0, depth - 1)
        deepest = max(deepest, depth)
        if deepest > _MAX_FLOW_DEPTH:
            raise InputFileError(f"{where}: nested too deeply for a run file (more than {_MAX_FLOW_DEPTH} [ or {{)")


def check_plain_values(value: Any, field: str) -> None:
    """Refuse NaN and infinity, integers beyond 64 bits, and over-long strings or lists, anywhere.

    Raises:
        UsageError: the message names the field (`transformer.hidden_dropout: expected ...`).
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{field}: expected a finite number, got {describe(value)}")
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_ABS_INT <= value < MAX_ABS_INT:
        raise UsageError(f"{field}: expected an integer within 64 bits, got {describe(value)}")
    if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
        raise UsageError(f"{field}: expected a string under {MAX_STRING_CHARS} characters, got {len(value)}")
    if isinstance(value, list | tuple):
        if len(value) > MAX_LIST_ITEMS:
            raise UsageError(f"{field}: expected a list under {MAX_LIST_ITEMS} items, got {len(value)}")
        for i, item in enumerate(value):
            check_plain_values(item, f"{field}[{i}]")
    if isinstance(value, dict):
        for key, item in value.items():
            check_plain_values(item, f"{field}.{key}")


def check_field_range(name: str, value: Any, field: str) -> None:
    """The ranges of the common fields, the same for `check` and `diff` (None passes: 'default').

    Raises:
        UsageError: wrong type or out of range; the message names the field.
    """
    if value is None:
        return
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if name in POSITIVE_INT_FIELDS and not (is_int and value >= 1):
        raise UsageError(f"{field}: expected an integer >= 1, got {describe(value)}")
    if name in NON_NEGATIVE_INT_FIELDS and not (is_int and value >= 0):
        raise UsageError(f"{field}: expected an integer >= 0, got {describe(value)}")
    if name in PROBABILITY_FIELDS:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and 0 <= value < 1):
            raise UsageError(f"{field}: expected a number in [0, 1), got {describe(value)}")
    if name in POSITIVE_NUMBER_FIELDS:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and value > 0):
            raise UsageError(f"{field}: expected a number > 0, got {describe(value)}")


def validate_section(section: str, values: dict[str, Any], where: str, lines: dict[str, int]) -> None:
    """check_plain_values and check_field_range for every key of a run-file section.

    Raises:
        UsageError: `where:LINE: section.key: expected ..., got ...`.
    """
    for key, value in values.items():
        at = f"{where}:{lines[key]}" if key in lines else where
        try:
            check_plain_values(value, f"{section}.{key}")
            if section == "run" and key in VARIABLE_RUN_FIELDS and (value == "variable" or isinstance(value, list)):
                for i, item in enumerate(value if isinstance(value, list) else ()):
                    check_field_range(key, item, f"{section}.{key}[{i}]")
                continue
            check_field_range(key, value, f"{section}.{key}")
        except UsageError as exc:
            raise UsageError(f"{at}: {exc}") from None


__all__ = [
    "MAX_RUN_FILE_VALUES",
    "NON_NEGATIVE_INT_FIELDS",
    "POSITIVE_INT_FIELDS",
    "POSITIVE_NUMBER_FIELDS",
    "PROBABILITY_FIELDS",
    "check_field_range",
    "check_plain_values",
    "load_yaml_strict",
    "loaded_yaml",
    "validate_section",
]
