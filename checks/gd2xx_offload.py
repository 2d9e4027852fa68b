"""GD23x offloading rules: CPU offloading and fine-grained activation offloading with CUDA graphs
(transformer_config.py:1706-1721, :1849-1912, :2467-2468, :2596-2641 of megatron-core 0.19.2).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import t

from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "offloading"
LOCAL_OFFLOAD = frozenset({"expert_fc1", "moe_act", "fused_group_mlp"})
OFFLOAD_MODULES = frozenset(
    {"core_attn", "attn_proj", "expert_fc1", "fused_group_mlp", "moe_act", "attn_norm", "mlp_norm", "qkv_linear"}
)


def _fine_grained(ctx: CheckContext) -> bool:
    return bool(ctx.value("fine_grained_activation_offloading")) and ctx.graph.enabled


class CpuOffloadingWithPerLayerGraphs(Rule):
    """## What it does
    Flags `cpu_offloading` with the local or transformer_engine graph implementation.

    ## Why is this bad?
    Offload copies run on their own stream with host-side bookkeeping per layer; Megatron raises
    `ValueError: CUDA graphs not supported with CPU offloading.` (`transformer_config.py:2467-2468`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cpu_offloading: true}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, fine_grained_activation_offloading: true, offload_modules: [core_attn]}
    ```

    ## Fix
    Use fine-grained activation offloading, full_iteration graphs, or no offloading.
    """

    code = "GD231"
    name = "cpu-offloading-with-per-layer-graphs"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "cpu_offloading=True with cuda_graph_impl={impl!r}"
    fix_template = "Turn off cpu_offloading or use cuda_graph_impl='full_iteration'"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.value("cpu_offloading") and ctx.graph.impl in (Impl.LOCAL, Impl.TRANSFORMER_ENGINE):
            yield Hit(t("cpu_offloading", "cuda_graph_impl"), {"impl": ctx.graph.impl})


class CpuOffloadingMisconfigured(Rule):
    """## What it does
    Flags `cpu_offloading` with activation recomputation, pipeline parallelism, or
    `cpu_offloading_num_layers` outside [0, num_layers).

    ## Why is this bad?
    Megatron raises before building anything (`transformer_config.py:1706-1721`), e.g. `CPU
    offloading does not work when activation recomputation is enabled`.

    ## Example
    ```yaml
    transformer: {cpu_offloading: true, recompute_granularity: selective}
    ```

    ## Use instead
    ```yaml
    transformer: {cpu_offloading: true}
    ```

    ## Fix
    Remove the conflicting setting.
    """

    code = "GD232"
    name = "cpu-offloading-misconfigured"
    severity = Severity.ERROR
    fix = FixAvailability.NONE
    template = "cpu_offloading: {reasons}"
    fix_template = "Remove the conflicting setting or turn off cpu_offloading"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        v = ctx.value
        if not v("cpu_offloading"):
            return
        problems = [
            (name, reason) for name, bad, reason in (
                ("cpu_offloading_num_layers", not 0 <= v("cpu_offloading_num_layers") < v("num_layers"),
                 "cpu_offloading_num_layers outside [0, num_layers)"),
                ("pipeline_model_parallel_size", v("pipeline_model_parallel_size") > 1, "pipeline parallelism"),
                ("recompute_granularity", v("recompute_granularity") is not None, "activation recomputation"),
                ("fine_grained_activation_offloading", bool(v("fine_grained_activation_offloading")),
                 "fine_grained_activation_offloading"),
                ("moe_paged_stash", bool(v("moe_paged_stash")), "moe_paged_stash"),
            ) if bad
        ]
        if problems:
            yield Hit(t("cpu_offloading", *(n for n, _ in problems)), {"reasons": ", ".join(r for _, r in problems)})


class LocalGraphOffloadUnsupportedModules(Rule):
    """## What it does
    Flags fine-grained activation offloading with the local impl for modules other than
    expert_fc1, moe_act and fused_group_mlp.

    ## Why is this bad?
    `fine-grained activation offloading with cuda_graph_impl='local' only supports offload_modules
    'expert_fc1', 'moe_act', and 'fused_group_mlp'.` (`transformer_config.py:2598-2606`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [attn], fine_grained_activation_offloading: true,
                  offload_modules: [core_attn]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [attn], fine_grained_activation_offloading: true,
                  offload_modules: [core_attn]}
    ```

    ## Fix
    Use the transformer_engine impl, or offload only expert modules.
    """

    code = "GD233"
    name = "local-graph-offload-unsupported-modules"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "offload_modules {modules} are not supported with cuda_graph_impl='local'"
    fix_template = "Offload only expert_fc1/moe_act/fused_group_mlp or use cuda_graph_impl='transformer_engine'"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        bad = sorted(set(ctx.offload_modules) - LOCAL_OFFLOAD)
        if _fine_grained(ctx) and ctx.graph.impl == Impl.LOCAL and bad:
            yield Hit(t("offload_modules", "cuda_graph_impl"), {"modules": bad})


class LocalWholeLayerGraphWithOffload(Rule):
    """## What it does
    Flags fine-grained activation offloading with local whole-layer capture (empty
    `cuda_graph_modules`).

    ## Why is this bad?
    `fine-grained activation offloading with cuda_graph_impl='local' is not supported with
    whole-layer CUDA graph capture.` (`transformer_config.py:2607-2610`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [], fine_grained_activation_offloading: true,
                  offload_modules: [expert_fc1]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [attn], fine_grained_activation_offloading: true,
                  offload_modules: [expert_fc1]}
    ```

    ## Fix
    List partial modules in `cuda_graph_modules`.
    """

    code = "GD234"
    name = "local-whole-layer-graph-with-offload"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "fine-grained offloading with local whole-layer capture (cuda_graph_modules empty)"
    fix_template = "List partial modules in cuda_graph_modules or turn off fine_grained_activation_offloading"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if _fine_grained(ctx) and ctx.graph.impl == Impl.LOCAL and not ctx.graph.modules:
            yield Hit(t("fine_grained_activation_offloading", "cuda_graph_modules"))


class OffloadWithUnsupportedGraph(Rule):
    """## What it does
    Flags fine-grained activation offloading with a graph setup other than transformer_engine,
    full_iteration, or local partial-MoE offload (expert modules offloaded, `moe` not captured).

    ## Why is this bad?
    `fine-grained activation offloading is only supported with transformer_engine CUDA graph
    implementation or local CUDA graph implementation with partial MoE offload.`
    (`transformer_config.py:2611-2625`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [attn], fine_grained_activation_offloading: true,
                  offload_modules: [attn_norm]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [attn], fine_grained_activation_offloading: true,
                  offload_modules: [attn_norm]}
    ```

    ## Fix
    Use transformer_engine or full_iteration graphs.
    """

    code = "GD235"
    name = "offload-with-unsupported-graph"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "fine-grained offloading of {modules} is not supported with cuda_graph_impl={impl!r} here"
    fix_template = "Use cuda_graph_impl='transformer_engine' or 'full_iteration'"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        mods = set(ctx.offload_modules)
        partial = ctx.graph.impl == Impl.LOCAL and bool(mods) and mods <= LOCAL_OFFLOAD and "moe" not in ctx.graph.modules
        if _fine_grained(ctx) and ctx.graph.impl not in (Impl.TRANSFORMER_ENGINE, Impl.FULL_ITERATION) and not partial:
            yield Hit(t("fine_grained_activation_offloading", "cuda_graph_impl", "offload_modules"),
                      {"modules": sorted(mods), "impl": ctx.graph.impl})


class OffloadWithMoeGraph(Rule):
    """## What it does
    Flags fine-grained activation offloading with `moe` in `cuda_graph_modules`.

    ## Why is this bad?
    `Token-drop MoE is temporarily not supported with activation offloading.`
    (`transformer_config.py:2626-2628`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [moe], fine_grained_activation_offloading: true,
                  offload_modules: [core_attn]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [attn], fine_grained_activation_offloading: true,
                  offload_modules: [core_attn]}
    ```

    ## Fix
    Capture `moe_router` instead of `moe`, or do not offload.
    """

    code = "GD236"
    name = "offload-with-moe-graph"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "fine-grained offloading with moe captured in the CUDA graph"
    fix_template = "Remove moe from cuda_graph_modules or turn off fine_grained_activation_offloading"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if _fine_grained(ctx) and "moe" in ctx.graph.modules:
            yield Hit(t("fine_grained_activation_offloading", "cuda_graph_modules"))


class OffloadWithoutGraphWarmup(Rule):
    """## What it does
    Flags fine-grained activation offloading with graphs and `cuda_graph_warmup_steps <= 0`.

    ## Why is this bad?
    The offload manager learns tensor sizes during warmup: `cuda_graph_warmup_steps must be greater
    than 0 when enabling fine-grained activation offloading.` (`transformer_config.py:2629-2632`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_warmup_steps: 0,
                  fine_grained_activation_offloading: true, offload_modules: [core_attn]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_warmup_steps: 1,
                  fine_grained_activation_offloading: true, offload_modules: [core_attn]}
    ```

    ## Fix
    Set `cuda_graph_warmup_steps` to 1 or more.
    """

    code = "GD237"
    name = "offload-without-graph-warmup"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "cuda_graph_warmup_steps={steps} with fine-grained activation offloading"
    fix_template = "Set cuda_graph_warmup_steps to at least 1"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        steps = ctx.value("cuda_graph_warmup_steps")
        if _fine_grained(ctx) and steps <= 0:
            yield Hit(t("cuda_graph_warmup_steps", "fine_grained_activation_offloading"), {"steps": steps})


class FullIterationOffloadWithoutInflightLimit(Rule):
    """## What it does
    Flags fine-grained offloading with full_iteration graphs without a non-negative
    `fine_grained_offloading_max_inflight_offloads`.

    ## Why is this bad?
    The whole iteration is one graph, so the number of in-flight offload buffers must be static:
    `fine_grained_offloading_max_inflight_offloads must be a non-negative integer when using
    fine-grained activation offloading with full-iteration CUDA graphs` (`transformer_config.py:2633-2641`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: full_iteration, fine_grained_activation_offloading: true, offload_modules: [core_attn]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: full_iteration, fine_grained_activation_offloading: true, offload_modules: [core_attn],
                  fine_grained_offloading_max_inflight_offloads: 2}
    ```

    ## Fix
    Set `fine_grained_offloading_max_inflight_offloads` to a non-negative integer.
    """

    code = "GD238"
    name = "full-iteration-offload-without-inflight-limit"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "fine_grained_offloading_max_inflight_offloads={value!r} with full_iteration graphs"
    fix_template = "Set fine_grained_offloading_max_inflight_offloads to a non-negative integer"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        value = ctx.value("fine_grained_offloading_max_inflight_offloads")
        if _fine_grained(ctx) and ctx.graph.impl == Impl.FULL_ITERATION and (value is None or value < 0):
            yield Hit(t("fine_grained_offloading_max_inflight_offloads", "cuda_graph_impl"), {"value": value})


def _offload_problems(ctx: CheckContext) -> list[str]:
    """transformer_config.py:1849-1904 (fine-grained offloading validation, graphs or not)."""
    v, mods = ctx.value, set(ctx.offload_modules)
    out = ["offload_modules is empty"] if not mods else []
    out += [f"unknown offload_modules {sorted(mods - OFFLOAD_MODULES)}"] if mods - OFFLOAD_MODULES else []
    out += ["attn_proj without core_attn"] if "attn_proj" in mods and "core_attn" not in mods else []
    inside_moe = mods & {"moe_act", "expert_fc1", "fused_group_mlp"}
    if ctx.recompute_granularity == "selective" and "moe" in ctx.recompute_modules and inside_moe:
        out.append(f"offloading {sorted(inside_moe)} inside a recomputed moe")
    if "fused_group_mlp" in mods and not v("use_transformer_engine_op_fuser"):
        out.append("fused_group_mlp needs use_transformer_engine_op_fuser")
    elif "fused_group_mlp" in mods and mods & {"expert_fc1", "moe_act"}:
        out.append("fused_group_mlp cannot be combined with expert_fc1/moe_act")
    return out


class OffloadModulesInvalid(Rule):
    """## What it does
    Flags fine-grained activation offloading whose `offload_modules` Megatron rejects: empty,
    unknown names, attn_proj without core_attn, modules inside a recomputed moe, fused_group_mlp
    without the TE op fuser or mixed with expert_fc1/moe_act.

    ## Why is this bad?
    `TransformerConfig.__post_init__` asserts these (`transformer_config.py:1849-1904`).

    ## Example
    ```yaml
    transformer: {fine_grained_activation_offloading: true, offload_modules: [attn_proj]}
    ```

    ## Use instead
    ```yaml
    transformer: {fine_grained_activation_offloading: true, offload_modules: [core_attn, attn_proj]}
    ```

    ## Fix
    Correct `offload_modules` as listed.
    """

    code = "GD239"
    name = "offload-modules-invalid"
    severity = Severity.ERROR
    fix = FixAvailability.NONE
    template = "fine-grained activation offloading: {reasons}"
    fix_template = "Correct offload_modules as listed"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.value("fine_grained_activation_offloading"):
            problems = _offload_problems(ctx)
            if problems:
                yield Hit(t("offload_modules", "fine_grained_activation_offloading"), {"reasons": "; ".join(problems)})
