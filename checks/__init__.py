"""Rule catalogue, installed as graphdoctor.checks: one module per rule family (gdNxx_<family>.py).

The registry (graphdoctor.rules.registry) discovers every module here whose name starts with `gd`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphdoctor.rules.context import CheckContext


def t(*names: str) -> tuple[str, ...]:
    """`transformer.<name>` keys for Hit.fields."""
    return tuple(f"transformer.{n}" for n in names)


def given(ctx: CheckContext, *names: str) -> tuple[str, ...]:
    """`transformer.<name>` keys of the names that were given explicitly (others are defaults)."""
    return tuple(f"transformer.{n}" for n in names if n in ctx.transformer)


__all__ = ["given", "t"]
