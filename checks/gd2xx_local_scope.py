"""GD2xx `local` graph scopes on GPT layers: what a non-empty cuda_graph_modules list graphs under
megatron-core 0.19.2's `local` implementation when the layers are `TransformerLayer` (Megatron's GPT
local and Transformer Engine specs, for dense and MoE models alike).

Sources (megatron-core 0.19.2): models/gpt/gpt_layer_specs.py:467-470 (`get_gpt_layer_local_spec`
builds TransformerLayer); transformer/module.py:172-178 (a graphable module's __init__ calls
`create_mcore_cudagraph_manager`), :365-367 (`__call__` hands the whole forward to that manager);
transformer/transformer_layer.py:541-567 (one whole-layer CudaGraphManager for an empty list, `attn`,
or `mlp` on a dense layer; none otherwise), :1523-1610 (only MoETransformerLayer, built by hybrid
specs, has partial router / postprocess graphs).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks.gd1xx_bridge import bridge_refuses_local
from graphdoctor.checks.gd2xx_moe_dispatch import per_layer_runs

from graphdoctor.config.entry_points import BUILTIN_LAYER_SPECS
from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "configuration"

WHOLE_LAYER = "megatron/core/transformer/transformer_layer.py:556-567"
"""`create_mcore_cudagraph_manager`: one CudaGraphManager for the whole layer for `attn` or `mlp`."""

NO_MANAGER = "megatron/core/transformer/transformer_layer.py:541-567"
"""`create_mcore_cudagraph_manager` creates no manager when the list has neither `attn` nor `mlp`."""


def builds_gpt_layers(ctx: CheckContext) -> bool:
    """The run builds Megatron's GPT TransformerLayer: a built-in layer spec and no model provider."""
    spec = ctx.run.get("layer_spec")
    return not ctx.run.get("model_provider") and (spec is None or spec in BUILTIN_LAYER_SPECS)


def local_layer_graph(modules: tuple[str, ...], moe: bool) -> str | None:
    """What `local` graphs in a GPT TransformerLayer for a non-empty list: `whole` (the layer's whole
    forward), `nothing`, or None where Megatron refuses the list (`mlp` on MoE layers: GD204; MoE
    modules on a dense model: GD203, transformer_config.py:2491-2495) or its set-up crashes (`mlp` without
    `attn` on dense layers: GD240)."""
    if "attn" in modules:
        return "whole"
    if "mlp" in modules:
        return None  # dense: Megatron's set-up crashes (GD240); MoE: Megatron refuses it (GD204)
    if not moe and {"moe", "moe_router", "moe_preprocess"} & set(modules):
        return None
    return "nothing"


class LocalScopeIsWholeLayerOrNothing(Rule):
    """## What it does
    Flags `cuda_graph_impl: local` (or a `local` run of `graphdoctor diff`) with a non-empty
    `cuda_graph_modules` on Megatron's GPT layers: `attn` (and `mlp` on dense layers) graph the whole
    layer, exactly as an empty list does; `moe_router`, `moe_preprocess` and `moe` graph nothing.

    ## Why is this bad?
    In megatron-core 0.19.2 `get_gpt_layer_local_spec` and the Transformer Engine GPT spec build
    `TransformerLayer`, for MoE models too (`gpt_layer_specs.py:467-470`). Under `local`, its
    `create_mcore_cudagraph_manager` (`transformer_layer.py:541-567`, called from
    `module.py:172-178`) makes ONE CudaGraphManager for the whole layer when the list is empty,
    contains `attn`, or (dense layers) `mlp`, and `__call__` (`module.py:365-367`) graphs the layer's
    whole forward with it. A list of only `moe_router` / `moe_preprocess` / `moe` creates no manager,
    so nothing in the layer is graphed. Per-scope `local` graphs exist only in `MoETransformerLayer`
    (`transformer_layer.py:1523-1610`), which hybrid specs build, not GPT specs. So a scope chosen to
    stop before MoE token dispatch does not: on the H200 `local` + `attn` of a dropless MoE fails
    capture at `token_dispatcher.py:317` like the whole layer (GD217), and `moe_router` gives no graph.

    ## Example
    ```yaml
    transformer: {num_moe_experts: 4, moe_router_topk: 2, add_bias_linear: false,
                  cuda_graph_impl: local, cuda_graph_modules: [attn]}
    ```

    ## Use instead
    ```yaml
    transformer: {num_moe_experts: 4, moe_router_topk: 2, add_bias_linear: false,
                  cuda_graph_impl: transformer_engine, cuda_graph_modules: [attn, moe_router, moe_preprocess]}
    ```

    ## Fix
    Use `transformer_engine` for per-scope graphs, or an empty `cuda_graph_modules` for whole-layer
    `local` graphs (what `attn` gives anyway).

    ## Known problems
    Judged only for Megatron's built-in GPT specs (`layer_spec` local / te, no `model_provider`); a
    custom spec building `MoETransformerLayer` has real partial `local` graphs. `mlp` on MoE layers is
    refused by Megatron (GD204) and not repeated here.
    """

    code = "GD219"
    name = "local-scope-is-whole-layer-or-nothing"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = "local {modules} graphs {what} (megatron-core 0.19.2 GPT TransformerLayer, {location})"
    fix_template = ("Use transformer_engine for per-scope graphs, or an empty cuda_graph_modules for whole-layer "
                    "local graphs")

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if not builds_gpt_layers(ctx) or bridge_refuses_local(ctx):
            return  # (a Megatron-Bridge config refuses these `local` graphs itself: GD141)
        for run in per_layer_runs(ctx):
            if run.impl != Impl.LOCAL or not run.modules:
                continue
            graphed = local_layer_graph(run.modules, ctx.is_moe)
            if graphed is None:
                continue
            what = ("the whole layer, as [] does" if graphed == "whole"
                    else "nothing in the layer (no CudaGraphManager)")
            yield Hit(run.fields,
                      {"modules": list(run.modules), "what": what,
                       "location": WHOLE_LAYER if graphed == "whole" else NO_MANAGER})


__all__ = ["LocalScopeIsWholeLayerOrNothing", "builds_gpt_layers", "local_layer_graph"]


SETUP_CRASH = "megatron/core/transformer/transformer_layer.py:566"
"""`assert not self.is_moe_layer` in create_mcore_cudagraph_manager, reached from GraphableMegatronModule.__init__
(module.py:172-174) before TransformerLayer.__init__ sets is_moe_layer (transformer_layer.py:445)."""


def local_mlp_crashes(modules: tuple[str, ...]) -> bool:
    """`local` with this non-empty list reaches the `mlp` branch of create_mcore_cudagraph_manager."""
    return "mlp" in modules and "attn" not in modules


class LocalMlpScopeCrashesAtBuild(Rule):
    """## What it does
    Flags `cuda_graph_impl: local` with `cuda_graph_modules` holding `mlp` and not `attn`, on a model built of
    Megatron's `TransformerLayer` (its GPT local and Transformer Engine specs, and specs built on them).

    ## Why is this bad?
    The model is never built. `TransformerLayer.__init__` calls `GraphableMegatronModule.__init__`
    (`module.py:172-174`), whose `create_mcore_cudagraph_manager` takes the `mlp` branch and runs
    `assert not self.is_moe_layer` (`transformer_layer.py:566`) before `__init__` has set `is_moe_layer`
    (`transformer_layer.py:445`): `AttributeError: 'TransformerLayer' object has no attribute 'is_moe_layer'`
    on every rank, at set-up (megatron-core 0.19.2; NVIDIA-NeMo/Megatron-Bridge#4583). Had it been built, `mlp`
    would have graphed the whole layer anyway (GD219).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [mlp]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [mlp]}
    ```

    ## Fix
    Use `transformer_engine` for an MLP-only graph, or an empty `cuda_graph_modules` for whole-layer `local` graphs.

    ## Known problems
    A custom layer class that overrides `create_mcore_cudagraph_manager` (Megatron's `MoETransformerLayer`, which
    hybrid specs build) does not crash; `model_provider` models are not judged. On MoE layers Megatron refuses
    `mlp` earlier (GD204).
    """

    code = "GD240"
    name = "local-mlp-scope-crashes-at-build"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = ("local {modules} crashes while Megatron builds the model: AttributeError: 'TransformerLayer' object "
                "has no attribute 'is_moe_layer' (at {location}; Megatron-Bridge#4583)")
    fix_template = "Use transformer_engine for an MLP-only graph, or an empty cuda_graph_modules for whole-layer local graphs"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.run.get("model_provider") or ctx.is_moe or bridge_refuses_local(ctx):
            return  # (MoE: Megatron refuses `mlp` first, GD204; Megatron-Bridge refuses local scopes, GD141)
        for run in per_layer_runs(ctx):
            if run.impl == Impl.LOCAL and run.modules and local_mlp_crashes(run.modules):
                yield Hit(run.fields, {"modules": list(run.modules), "location": SETUP_CRASH})
