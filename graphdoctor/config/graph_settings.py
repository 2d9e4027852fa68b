"""Mirror of megatron-core 0.19.2's CUDA-graph field normalisation (transformer_config.py:2365-2482,
cuda_graph_config.py), done on plain values so that rules see what __post_init__ would see.

No megatron import: enum members are accepted by their `.name`. graph_choice says what diff takes from them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphdoctor.config.impl import MEGATRON_EAGER, Impl
from graphdoctor.errors import UsageError
from graphdoctor.inputs import describe
from graphdoctor.suggest import did_you_mean

MODULE_NAMES: tuple[str, ...] = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
"""Values TransformerConfig.cuda_graph_modules accepts in megatron-core 0.19.2."""
DEPRECATED_MODULES: dict[str, tuple[str, str]] = {
    "full_iteration": ("cuda_graph_impl", Impl.FULL_ITERATION.megatron),
    "full_iteration_inference": ("inference_cuda_graph_scope", "block"),
}
INFERENCE_SCOPES: tuple[str, ...] = ("none", "layer", "block")
ALLOWED_INFERENCE_SCOPES: dict[str, frozenset[str]] = {
    MEGATRON_EAGER: frozenset({"none"}),
    Impl.LOCAL: frozenset({"layer", "block"}),
    Impl.TRANSFORMER_ENGINE: frozenset({"none"}),
    Impl.FULL_ITERATION: frozenset({"none"}),
}
MISSING = object()


def enum_name(value: Any) -> Any:
    """`CudaGraphModule.attn` -> 'attn'; any non-enum value unchanged."""
    cls = type(value)
    if cls.__name__ in ("CudaGraphModule", "CudaGraphScope", "InferenceCudaGraphScope"):
        return value.name
    return value


@dataclass(frozen=True, slots=True)
class GraphSettings:
    """CUDA-graph settings after Megatron's normalisation (best effort past the first error)."""

    impl: str
    """Effective cuda_graph_impl (after legacy flags and the 'full_iteration' module migration)."""
    modules: tuple[str, ...]
    """Effective cuda_graph_modules names (local impl: moe_router/moe_preprocess auto-added)."""
    raw_modules: tuple[Any, ...]
    """Module entries after the cuda_graph_scope migration and the ',' split, before normalising."""
    deprecated: tuple[str, ...]
    used_full: bool
    full_mixed: bool
    bad_entries: tuple[Any, ...]
    """Entries that are not strings, or not CudaGraphModule names."""
    inference_scope: str | None
    """Normalised inference scope name; None when the given value is not a valid scope."""
    raw_inference_scope: Any
    legacy_with_impl: bool
    legacy_both: bool
    scope_with_modules: bool
    auto_added: tuple[str, ...]
    migrated_impl: bool
    """True when the deprecated 'full_iteration' module value set impl=full_iteration."""

    @property
    def enabled(self) -> bool:
        """Any graph implementation is active."""
        return self.impl != MEGATRON_EAGER

    @property
    def whole_layer(self) -> bool:
        """Megatron's `full_cudagraph`: full_iteration impl or an empty per-layer module list."""
        return self.impl == Impl.FULL_ITERATION or not self.modules


def _split_modules(modules: Any) -> list[Any]:
    if modules is None:
        return []
    if isinstance(modules, list | tuple):
        return [enum_name(m) for m in modules]
    if isinstance(modules, str):
        return modules.split(",") if modules else []
    return [enum_name(modules)]


def _classify(entries: list[Any]) -> tuple[list[str], list[str], list[Any]]:
    """Split module entries into (CudaGraphModule names, deprecated values, invalid entries)."""
    names: list[str] = []
    deprecated: list[str] = []
    bad: list[Any] = []
    for entry in entries:
        if not isinstance(entry, str):
            bad.append(entry)
        elif entry in DEPRECATED_MODULES:
            deprecated.append(entry)
        elif entry in MODULE_NAMES:
            names.append(entry)
        else:
            bad.append(entry)
    return names, deprecated, bad


def normalize(value: Any) -> GraphSettings:
    """Normalise the CUDA-graph fields; `value(name)` returns a TransformerConfig field's value."""
    impl = value("cuda_graph_impl")
    enable, external = bool(value("enable_cuda_graph")), bool(value("external_cuda_graph"))
    legacy_with_impl = (enable or external) and impl != MEGATRON_EAGER
    if (enable or external) and impl == MEGATRON_EAGER:
        impl = Impl.TRANSFORMER_ENGINE.megatron if external else Impl.LOCAL.megatron
    modules = value("cuda_graph_modules")
    scope = value("cuda_graph_scope")
    scope_with_modules = False
    if scope is not None:
        scope_with_modules = modules not in ("full", None, [])
        modules = [enum_name(s) for s in scope] if isinstance(scope, list | tuple) else enum_name(scope)
    raw = _split_modules(modules)
    used_full = "full" in raw
    full_mixed = used_full and raw != ["full"]
    names, deprecated, bad = _classify([] if used_full else raw)
    raw_scope = enum_name(value("inference_cuda_graph_scope"))
    inference: str | None = raw_scope
    if inference is not None and inference not in INFERENCE_SCOPES:
        inference = "invalid"
    migrated = False
    if len(set(deprecated)) == 1:
        if deprecated[0] == "full_iteration" and impl in (MEGATRON_EAGER, Impl.LOCAL, Impl.FULL_ITERATION):
            migrated = impl != Impl.FULL_ITERATION
            impl = Impl.FULL_ITERATION.megatron
        elif deprecated[0] == "full_iteration_inference" and impl == Impl.LOCAL and inference != "invalid":
            inference = "block"
    if inference is None:
        inference = "layer" if impl == Impl.LOCAL else "none"
    elif inference not in INFERENCE_SCOPES:
        inference = None
    auto: list[str] = []
    if impl == Impl.LOCAL and ("moe_router" in names or "moe_preprocess" in names):
        auto = [m for m in ("moe_router", "moe_preprocess") if m not in names]
        names.extend(auto)
    return GraphSettings(
        impl=impl if isinstance(impl, str) else repr(impl),
        modules=tuple(names),
        raw_modules=tuple(raw),
        deprecated=tuple(deprecated),
        used_full=used_full,
        full_mixed=full_mixed,
        bad_entries=tuple(bad),
        inference_scope=inference,
        raw_inference_scope=raw_scope,
        legacy_with_impl=legacy_with_impl,
        legacy_both=enable and external,
        scope_with_modules=scope_with_modules,
        auto_added=tuple(auto),
        migrated_impl=migrated,
    )


GRAPH_DEFAULTS: dict[str, Any] = {"cuda_graph_impl": MEGATRON_EAGER, "enable_cuda_graph": False,
                                  "external_cuda_graph": False, "cuda_graph_modules": []}
"""TransformerConfig's defaults of the CUDA-graph settings graph_choice reads (the deprecated scope: None)."""


def graph_choice(value: Callable[[str], Any], name: Callable[[str], str]) -> GraphSettings:
    """What diff takes from Megatron's CUDA-graph settings, a launch line's or a run file's `transformer:`: the
    implementation to diff (`impl`, "none" where they build no graphs) and its `modules`, as Megatron normalises
    them (normalize, above: the legacy flags, the deprecated scope, the MoE modules added for `local`).

    Args:
        value: a TransformerConfig field's value, None where unset (GRAPH_DEFAULTS apply).
        name: how the user wrote a field, for the error (`--cuda-graph-modules`, `run.yaml: transformer.cuda_graph_modules`).

    Raises:
        UsageError: a module Megatron does not know, or modules with full_iteration (Megatron-LM refuses the pair).
    """
    settings = normalize(lambda field: GRAPH_DEFAULTS.get(field) if value(field) is None else value(field))
    if settings.bad_entries:
        bad = str(settings.bad_entries[0])
        raise UsageError(f"{name('cuda_graph_modules')}: got {describe(bad)}, expected one of "
                         f"{', '.join(MODULE_NAMES)}{did_you_mean(bad, MODULE_NAMES)}")
    if settings.impl == Impl.FULL_ITERATION and settings.modules:
        raise UsageError(f"{name('cuda_graph_modules')}: expected none with {name('cuda_graph_impl')} full_iteration "
                         "(Megatron-LM refuses the pair)")
    return settings


__all__ = [
    "GRAPH_DEFAULTS",
    "graph_choice",
    "ALLOWED_INFERENCE_SCOPES",
    "DEPRECATED_MODULES",
    "INFERENCE_SCOPES",
    "MODULE_NAMES",
    "GraphSettings",
    "enum_name",
    "normalize",
]
