"""Rule catalogue, installed as graphdoctor.checks: one module per rule family (gdNxx_<family>.py).

The registry (graphdoctor.rules.registry) discovers every module here whose name starts with `gd`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphdoctor.rules.context import CheckContext
    from graphdoctor.rules.finding import Severity


def t(*names: str) -> tuple[str, ...]:
    """`transformer.<name>` keys for Hit.fields."""
    return tuple(f"transformer.{n}" for n in names)


def rewritten(ctx: CheckContext) -> Severity | None:
    """The severity of a deprecated spelling: info on a Megatron-LM line, whose validate_args rewrites it by itself
    (with its own deprecation warning), and on a Megatron-Bridge or Megatron container config, whose
    TransformerConfig migrates it when the run builds it; the rule's own on graphdoctor's run file, which the user
    writes for graphdoctor."""
    from graphdoctor.rules.finding import Severity

    return Severity.INFO if ctx.megatron_lm or ctx.bridge is not None else None


def given(ctx: CheckContext, *names: str) -> tuple[str, ...]:
    """`transformer.<name>` keys of the names that were given explicitly (others are defaults)."""
    return tuple(f"transformer.{n}" for n in names if n in ctx.transformer)


def selective_recompute(ctx: CheckContext) -> tuple[list[str], tuple[str, ...]] | None:
    """(recompute_modules, the keys that set them) when recompute is selective, else None. `graphdoctor
    diff`'s run.recompute_* keys sit over the transformer's (DiffConfig.recompute_settings)."""
    granularity = ctx.run.get("recompute_granularity") or ctx.recompute_granularity
    modules = ctx.run.get("recompute_modules") or ctx.recompute_modules
    if granularity != "selective" or not isinstance(modules, list | tuple):
        return None
    declared = tuple(f"run.{k}" for k in ("recompute_granularity", "recompute_modules") if k in ctx.run)
    return list(modules), (*given(ctx, "recompute_granularity", "recompute_modules"), *declared)


__all__ = ["given", "rewritten", "selective_recompute", "t"]
