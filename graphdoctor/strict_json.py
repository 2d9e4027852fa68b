"""Strict JSON for everything graphdoctor writes: non-finite floats become the strings "nan", "inf"
and "-inf" (JSON has no NaN), and read back as floats. One home for the convention."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

NON_FINITE: tuple[str, ...] = ("nan", "inf", "-inf")


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float (at any depth of dicts, lists and tuples) as a string."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def is_non_finite_text(value: Any) -> bool:
    """True for the strings json_safe writes for non-finite floats (and `+inf`, `infinity`)."""
    return isinstance(value, str) and value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity")


__all__ = ["NON_FINITE", "is_non_finite_text", "json_safe"]


def nullable[T](convert: Callable[[Any], T], value: Any) -> T | None:
    """`convert(value)`, or None where the field is null: a record's optional field read back from JSON."""
    return None if value is None else convert(value)
