"""Rule catalogue, installed as graphdoctor.checks: one module per rule family (gdNxx_<family>.py).

The registry (graphdoctor.rules.registry) discovers every module here whose name starts with `gd`.
"""

from __future__ import annotations


def t(*names: str) -> tuple[str, ...]:
    """`transformer.<name>` keys for Hit.fields."""
    return tuple(f"transformer.{n}" for n in names)


def given(ctx: object, *names: str) -> tuple[str, ...]:
    """`transformer.<name>` keys of the names that were given explicitly (others are defaults)."""
    transformer = getattr(ctx, "transformer")
    return tuple(f"transformer.{n}" for n in names if n in transformer)


__all__ = ["given", "t"]
