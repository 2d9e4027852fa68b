"""The implementations graphdoctor runs: the eager reference and Megatron's three CUDA-graph implementations, with
their Megatron spellings (TransformerConfig.cuda_graph_impl, Megatron-LM's --cuda-graph-impl)."""

from __future__ import annotations

from enum import StrEnum


class Impl(StrEnum):
    """One implementation. A member equals its name as a string, so it reads and writes as one in JSON and specs."""

    EAGER = "eager"
    LOCAL = "local"
    FULL_ITERATION = "full_iteration"
    TRANSFORMER_ENGINE = "transformer_engine"

    @property
    def megatron(self) -> str:
        """TransformerConfig.cuda_graph_impl (and --cuda-graph-impl): `none` for the eager reference."""
        return MEGATRON_EAGER if self is Impl.EAGER else self.value

    @property
    def graphed(self) -> bool:
        """Whether the implementation captures CUDA graphs."""
        return self is not Impl.EAGER

    @property
    def per_module(self) -> bool:
        """Whether it graphs modules (cuda_graph_modules applies), not the whole iteration or nothing."""
        return self in (Impl.LOCAL, Impl.TRANSFORMER_ENGINE)


MEGATRON_EAGER = "none"
"""TransformerConfig.cuda_graph_impl of the eager reference."""

GRAPHED: tuple[Impl, ...] = (Impl.LOCAL, Impl.FULL_ITERATION, Impl.TRANSFORMER_ENGINE)
"""The graph implementations, in the order graphdoctor reports them."""

MEGATRON_IMPLS: tuple[str, ...] = tuple(impl.megatron for impl in (Impl.EAGER, *GRAPHED))
"""TransformerConfig.cuda_graph_impl's values in megatron-core 0.19.2."""


__all__ = ["GRAPHED", "MEGATRON_EAGER", "MEGATRON_IMPLS", "Impl"]
