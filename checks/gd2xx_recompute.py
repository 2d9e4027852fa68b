"""GD22x recompute rules: activation recomputation combined with CUDA graphs, and the recompute
settings megatron-core 0.19.2 validates (transformer_config.py:1713-1846, :2521-2573).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import t

from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "recompute"
SELECTIVE_MODULES = frozenset(
    {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "gdn_norm_out"}
)


def _selective_graphed(ctx: CheckContext) -> bool:
    return ctx.graph.enabled and ctx.recompute_granularity == "selective"


class FullRecomputeWithPerLayerGraphs(Rule):
    """## What it does
    Flags `recompute_granularity: full` with a per-layer graph implementation (local or TE).

    ## Why is this bad?
    Full recompute re-runs the whole layer in backward, outside any per-layer graph:
    `full recompute is only supported with full iteration CUDA graph.` (`transformer_config.py:2521-2525`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: full_iteration, recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1}
    ```

    ## Fix
    Use `cuda_graph_impl: full_iteration`, or selective recompute.
    """

    code = "GD221"
    name = "full-recompute-with-per-layer-graphs"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "recompute_granularity={granularity!r} with cuda_graph_impl={impl!r}"
    fix_template = "Switch to cuda_graph_impl='full_iteration' or recompute_granularity='selective'"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        granularity = ctx.recompute_granularity
        if ctx.graph.enabled and granularity and granularity != "selective" and ctx.graph.impl != Impl.FULL_ITERATION:
            yield Hit(t("recompute_granularity", "cuda_graph_impl"), {"granularity": granularity, "impl": ctx.graph.impl})


class MoeRecomputeWithMoeRouterGraph(Rule):
    """## What it does
    Flags selective recompute of `moe` with a TE `moe_router` graph.

    ## Why is this bad?
    The recomputed region would cover the graphed router: `moe recompute is not supported with
    moe_router CUDA graph` (`transformer_config.py:2529-2536`; NVIDIA/Megatron-LM#1667).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, num_moe_experts: 8, cuda_graph_modules: [moe_router],
                  recompute_granularity: selective, recompute_modules: [moe]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, num_moe_experts: 8, cuda_graph_modules: [moe_router],
                  recompute_granularity: selective, recompute_modules: [moe_act]}
    ```

    ## Fix
    Recompute inside or outside the graph scope, never a module that contains it.
    """

    code = "GD222"
    name = "moe-recompute-with-moe-router-graph"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "recompute_modules has moe while moe_router is graphed (transformer_engine)"
    fix_template = "Remove moe from recompute_modules or moe_router from cuda_graph_modules"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if _selective_graphed(ctx) and ctx.graph.impl == Impl.TRANSFORMER_ENGINE and "moe" in ctx.recompute_modules \
                and "moe_router" in ctx.graph.modules:
            yield Hit(t("recompute_modules", "cuda_graph_modules", "cuda_graph_scope"))


class AttentionDropoutWithGraphedRecompute(Rule):
    """## What it does
    Flags `attention_dropout != 0` when `core_attn` is recomputed inside a graph (whole-layer or
    full_iteration capture, or `attn` listed).

    ## Why is this bad?
    A graphed recompute cannot replay the same random mask: `attention dropout is not supported with
    graphed attention recomputation.` (`transformer_config.py:2539-2551`). Note `attention_dropout`
    defaults to 0.1 and `recompute_modules` to [core_attn].

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [], recompute_granularity: selective, attention_dropout: 0.1}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [], recompute_granularity: selective, attention_dropout: 0.0}
    ```

    ## Fix
    Set `attention_dropout: 0.0`, or stop recomputing core_attn inside the graph.
    """

    code = "GD223"
    name = "attention-dropout-with-graphed-recompute"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "attention_dropout={p} with core_attn recomputed inside the CUDA graph"
    fix_template = "Set attention_dropout to 0.0 or remove core_attn from recompute_modules"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        p = ctx.value("attention_dropout")
        graphed = ctx.graph.whole_layer or "attn" in ctx.graph.modules
        if _selective_graphed(ctx) and p != 0.0 and graphed and "core_attn" in ctx.recompute_modules:
            yield Hit(t("attention_dropout", "recompute_modules", "recompute_granularity"), {"p": p})


class HiddenDropoutWithGraphedRecompute(Rule):
    """## What it does
    Flags `hidden_dropout != 0` when `mlp` or `moe` is recomputed inside a graph.

    ## Why is this bad?
    `hidden dropout is not supported with graphed MLP/MoE recomputation.`
    (`transformer_config.py:2552-2566`). `hidden_dropout` defaults to 0.1.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [mlp], recompute_granularity: selective,
                  recompute_modules: [mlp]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [mlp], recompute_granularity: selective,
                  recompute_modules: [mlp], hidden_dropout: 0.0}
    ```

    ## Fix
    Set `hidden_dropout: 0.0`, or recompute outside the graphed modules.
    """

    code = "GD224"
    name = "hidden-dropout-with-graphed-recompute"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "hidden_dropout={p} with {module} recomputed inside the CUDA graph"
    fix_template = "Set hidden_dropout to 0.0 or remove {module} from recompute_modules"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        p = ctx.value("hidden_dropout")
        if not _selective_graphed(ctx) or p == 0.0:
            return
        for module in ("mlp", "moe"):
            if (ctx.graph.whole_layer or module in ctx.graph.modules) and module in ctx.recompute_modules:
                yield Hit(t("hidden_dropout", "recompute_modules", "recompute_granularity"), {"p": p, "module": module})
                return


class InputJitterWithGraphedMoeRecompute(Rule):
    """## What it does
    Flags `moe_input_jitter_eps` when `moe` is recomputed inside a graph.

    ## Why is this bad?
    Jitter draws random numbers the graphed recompute cannot reproduce: `moe_input_jitter_eps is not
    supported with graphed moe recomputation.` (`transformer_config.py:2567-2573`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [], recompute_granularity: selective,
                  recompute_modules: [moe], moe_input_jitter_eps: 0.01, hidden_dropout: 0.0}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [], recompute_granularity: selective,
                  recompute_modules: [moe], hidden_dropout: 0.0}
    ```

    ## Fix
    Unset `moe_input_jitter_eps`, or stop recomputing moe inside the graph.
    """

    code = "GD225"
    name = "input-jitter-with-graphed-moe-recompute"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "moe_input_jitter_eps={eps} with moe recomputed inside the CUDA graph"
    fix_template = "Unset moe_input_jitter_eps or remove moe from recompute_modules"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        eps = ctx.value("moe_input_jitter_eps")
        graphed = ctx.graph.whole_layer or "moe" in ctx.graph.modules
        if _selective_graphed(ctx) and eps is not None and graphed and "moe" in ctx.recompute_modules:
            yield Hit(t("moe_input_jitter_eps", "recompute_modules", "recompute_granularity"), {"eps": eps})


def _recompute_problems(ctx: CheckContext) -> list[tuple[str, str]]:
    """(field, reason) for transformer_config.py:1716-1846."""
    v = ctx.value
    granularity, method, num = v("recompute_granularity"), v("recompute_method"), v("recompute_num_layers")
    out: list[tuple[str, str]] = []
    if granularity is not None:
        if granularity not in ("full", "selective"):
            out.append(("recompute_granularity", f"granularity {granularity!r} is not full/selective"))
        if method is not None and method not in ("block", "uniform"):
            out.append(("recompute_method", f"method {method!r} is not block/uniform"))
        if method is None and granularity != "selective":
            out.append(("recompute_method", "full recompute needs recompute_method"))
        if granularity != "selective" and num is None:
            out.append(("recompute_num_layers", "full recompute needs recompute_num_layers"))
        if granularity == "selective" and num is not None:
            out.append(("recompute_num_layers", "selective recompute needs recompute_num_layers unset"))
        if v("distribute_saved_activations") and v("sequence_parallel"):
            out.append(("distribute_saved_activations", "distribute_saved_activations with sequence_parallel"))
    if v("moe_layer_recompute") and granularity == "full":
        out.append(("moe_layer_recompute", "moe_layer_recompute with full granularity"))
    if ctx.recompute_granularity == "selective":
        modules = set(ctx.recompute_modules)
        if modules - SELECTIVE_MODULES:
            out.append(("recompute_modules", f"unknown modules {sorted(modules - SELECTIVE_MODULES)}"))
        if "moe_act" in modules and not v("moe_grouped_gemm"):
            out.append(("recompute_modules", "moe_act needs moe_grouped_gemm"))
        if "mla_up_proj" in modules and not v("multi_latent_attention"):
            out.append(("recompute_modules", "mla_up_proj needs multi_latent_attention"))
        if "gdn_norm_out" in modules and v("experimental_attention_variant") != "gated_delta_net":
            out.append(("recompute_modules", "gdn_norm_out needs the gated_delta_net attention variant"))
        if "shared_experts" in modules and v("moe_shared_expert_intermediate_size") is not None \
                and v("moe_shared_expert_overlap"):
            out.append(("recompute_modules", "shared_experts recompute with moe_shared_expert_overlap"))
        if v("fp8") and modules & {"moe_act", "layernorm"} and v("fp8_recipe") == "delayed":
            out.append(("recompute_modules", "moe_act/layernorm recompute with delayed fp8 scaling"))
    return out


class RecomputeSettingsInvalid(Rule):
    """## What it does
    Flags recompute settings Megatron rejects before any graph is built: unknown granularity or
    method, full recompute without `recompute_method`/`recompute_num_layers`, selective with
    `recompute_num_layers`, unknown or unsupported `recompute_modules`.

    ## Why is this bad?
    `TransformerConfig.__post_init__` raises (`transformer_config.py:1716-1846`), e.g. `Using
    recompute_granularity: full so recompute_method must be "block" or "uniform"`.

    ## Example
    ```yaml
    transformer: {recompute_granularity: full}
    ```

    ## Use instead
    ```yaml
    transformer: {recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1}
    ```

    ## Fix
    Complete or correct the listed recompute fields.
    """

    code = "GD226"
    name = "recompute-settings-invalid"
    severity = Severity.ERROR
    fix = FixAvailability.NONE
    template = "invalid recompute settings: {reasons}"
    fix_template = "Correct the listed recompute fields"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        problems = _recompute_problems(ctx)
        if problems:
            names = dict.fromkeys(["recompute_granularity", *(name for name, _ in problems)])
            yield Hit(t(*names), {"reasons": "; ".join(reason for _, reason in problems)})
