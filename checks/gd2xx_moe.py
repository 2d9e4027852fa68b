"""GD2xx MoE rules: which MoE capture scopes megatron-core 0.19.2 accepts, and the MoE / A2A-overlap /
delay_wgrad settings its TransformerConfig (and Megatron-LM's validate_args) enforce around them.

Sources: transformer_config.py:1463-1690 and :2470-2519, :2669-2757; training/arguments.py:1822-1848.
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import t
from graphdoctor.checks.gd2xx_moe_dispatch import per_layer_runs

from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "moe"


def _scopes(ctx: CheckContext) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(cuda_graph_modules, `run.*` keys declaring them) of every per-layer graphed run: the
    training impl of `transformer:` and the `run.impls` that `graphdoctor diff` runs, without repeats."""
    out: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for run in per_layer_runs(ctx):
        scope = (run.modules, tuple(f for f in run.fields if f.startswith("run.")))
        if scope not in out:
            out.append(scope)
    return out


class MoeAndMoeRouterBothGraphed(Rule):
    """## What it does
    Flags `cuda_graph_modules` containing both `moe` and `moe_router` (local or TE impl).

    ## Why is this bad?
    `moe` already captures the router; two graphs cannot own the same region. Megatron asserts
    `cuda_graph_modules must not contain both moe and moe_router.` (`transformer_config.py:2484-2487`).
    With the local impl `moe_preprocess` implies `moe_router` (it is added silently, `:2472-2482`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [moe, moe_router]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [moe]}
    ```

    ## Fix
    Keep `moe` (drop-pad MoE) or `moe_router` (+ `moe_preprocess`), not both.
    """

    code = "GD201"
    name = "moe-and-moe-router-both-graphed"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "cuda_graph_modules {modules!r} contains both moe and moe_router"
    fix_template = "Remove moe or moe_router (and moe_preprocess) from cuda_graph_modules"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        for mods, where in _scopes(ctx):
            if "moe" in mods and "moe_router" in mods:
                yield Hit((*t("cuda_graph_modules", "cuda_graph_scope"), *where), {"modules": list(mods)})


class MoePreprocessWithoutMoeRouter(Rule):
    """## What it does
    Flags `moe_preprocess` in `cuda_graph_modules` without `moe_router` (transformer_engine impl).

    ## Why is this bad?
    The preprocess graph consumes the router graph's outputs: `moe_preprocess cuda graph is only
    supported with moe_router cuda graph.` (`transformer_config.py:2488-2491`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, num_moe_experts: 8, cuda_graph_modules: [moe_preprocess]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, num_moe_experts: 8, cuda_graph_modules: [moe_router, moe_preprocess]}
    ```

    ## Fix
    Add `moe_router` to `cuda_graph_modules`.
    """

    code = "GD202"
    name = "moe-preprocess-without-moe-router"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "cuda_graph_modules {modules!r} has moe_preprocess but not moe_router"
    fix_template = "Add moe_router to cuda_graph_modules"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        for mods, where in _scopes(ctx):
            if "moe_preprocess" in mods and "moe_router" not in mods:
                yield Hit((*t("cuda_graph_modules", "cuda_graph_scope"), *where), {"modules": list(mods)})


class MoeGraphWithoutExperts(Rule):
    """## What it does
    Flags `moe` or `moe_router` in `cuda_graph_modules` of a model without MoE (`num_moe_experts`
    unset or <= 1).

    ## Why is this bad?
    There is no MoE layer to capture: `moe cuda graph is only supported for MoE.`
    (`transformer_config.py:2492-2496`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [moe_router]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [attn, mlp]}
    ```

    ## Fix
    Graph `attn`/`mlp` for dense models, or set `num_moe_experts`.
    """

    code = "GD203"
    name = "moe-graph-without-experts"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "cuda_graph_modules {modules!r} captures MoE parts but num_moe_experts={experts!r}"
    fix_template = "Remove moe/moe_router from cuda_graph_modules or set num_moe_experts > 1"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        for mods, where in _scopes(ctx):
            if not ctx.is_moe and ("moe" in mods or "moe_router" in mods):
                yield Hit((*t("cuda_graph_modules", "cuda_graph_scope", "num_moe_experts"), *where),
                          {"modules": list(mods), "experts": ctx.value("num_moe_experts")})


class MlpGraphWithoutDenseLayers(Rule):
    """## What it does
    Flags `mlp` in `cuda_graph_modules` when every layer is MoE (`moe_layer_freq` 1 or a list
    without 0).

    ## Why is this bad?
    `mlp` graphs only dense MLPs: `mlp cuda graph is only supported for dense layers, but not found in
    the model.` (`transformer_config.py:2498-2504`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, num_moe_experts: 8, cuda_graph_modules: [mlp]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, num_moe_experts: 8, cuda_graph_modules: [moe_router]}
    ```

    ## Fix
    Capture `moe_router`/`moe` instead, or make some layers dense with `moe_layer_freq`.
    """

    code = "GD204"
    name = "mlp-graph-without-dense-layers"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "cuda_graph_modules has mlp but every layer is MoE (moe_layer_freq={freq!r})"
    fix_template = "Replace mlp with moe_router or moe in cuda_graph_modules"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        freq = ctx.value("moe_layer_freq")
        all_moe = freq == 1 or (isinstance(freq, list) and 0 not in freq)
        for mods, where in _scopes(ctx):
            if ctx.is_moe and all_moe and "mlp" in mods:
                yield Hit((*t("cuda_graph_modules", "cuda_graph_scope", "moe_layer_freq", "num_moe_experts"), *where),
                          {"freq": freq})


class MoeGraphWithDroplessMoe(Rule):
    """## What it does
    Flags `moe` in `cuda_graph_modules` without drop-and-pad MoE (`moe_expert_capacity_factor` set
    and `moe_pad_expert_input_to_capacity: true`).

    ## Why is this bad?
    Dropless routing gives data-dependent expert shapes, which a static graph cannot replay:
    `moe cuda graph is only supported with drop-padding MoE.` (`transformer_config.py:2505-2511`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, num_moe_experts: 8, cuda_graph_modules: [moe]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, num_moe_experts: 8, cuda_graph_modules: [moe],
                  moe_expert_capacity_factor: 1.0, moe_pad_expert_input_to_capacity: true}
    ```

    ## Fix
    Set a capacity factor with padding, or capture only `moe_router`.
    """

    code = "GD205"
    name = "moe-graph-with-dropless-moe"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "moe is graphed but MoE is dropless (capacity_factor={factor!r}, pad_to_capacity={pad!r})"
    fix_template = "Set moe_expert_capacity_factor and moe_pad_expert_input_to_capacity, or graph moe_router instead"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        pad = ctx.value("moe_pad_expert_input_to_capacity")
        for mods, where in _scopes(ctx):
            if ctx.is_moe and (ctx.capacity_factor is None or not pad) and "moe" in mods:
                yield Hit((*t("cuda_graph_modules", "cuda_graph_scope", "moe_expert_capacity_factor",
                              "moe_pad_expert_input_to_capacity"), *where), {"factor": ctx.capacity_factor, "pad": pad})


class MoePreprocessGraphWithHostSync(Rule):
    """## What it does
    Flags `moe_preprocess` capture with the alltoall dispatcher when the preprocess step does
    device-to-host copies: capacity factor without padding, or `moe_router_padding_for_fp8`.

    ## Why is this bad?
    A DtoH copy inside capture invalidates it: `moe_preprocess cuda graph is not supported when there
    are DtoH copies and synchronizations in the preprocess step.` (`transformer_config.py:2512-2519`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, num_moe_experts: 8, moe_token_dispatcher_type: alltoall,
                  moe_expert_capacity_factor: 1.0, cuda_graph_modules: [moe_router, moe_preprocess]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, num_moe_experts: 8, moe_token_dispatcher_type: alltoall,
                  moe_expert_capacity_factor: 1.0, cuda_graph_modules: [moe_router]}
    ```

    ## Fix
    Drop `moe_preprocess`, or pad to capacity so the preprocess is sync-free.
    """

    code = "GD206"
    name = "moe-preprocess-graph-with-host-sync"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "moe_preprocess is graphed but the alltoall preprocess syncs with the host ({reason})"
    fix_template = "Remove moe_preprocess from cuda_graph_modules or set moe_pad_expert_input_to_capacity"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        pad = ctx.value("moe_pad_expert_input_to_capacity")
        fp8_pad = ctx.value("moe_router_padding_for_fp8")
        if not (ctx.is_moe and (ctx.capacity_factor is None or not pad)):
            return
        if ctx.value("moe_token_dispatcher_type") != "alltoall" or (ctx.capacity_factor is None and not fp8_pad):
            return
        reason = "capacity factor without padding" if ctx.capacity_factor is not None else "fp8 router padding"
        for mods, where in _scopes(ctx):
            if "moe_preprocess" in mods:
                yield Hit((*t("cuda_graph_modules", "cuda_graph_scope", "moe_token_dispatcher_type",
                              "moe_expert_capacity_factor", "moe_router_padding_for_fp8"), *where), {"reason": reason})


class MoeGraphWithA2aOverlap(Rule):
    """## What it does
    Flags `moe` or `mlp` capture with the transformer_engine impl and
    `overlap_moe_expert_parallel_comm`.

    ## Why is this bad?
    The A2A overlap schedule splits the MoE layer across micro-batches, which whole-MLP graphs cannot
    follow: `CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm`
    (`transformer_config.py:2738-2746`). NVIDIA/Megatron-LM#5966 reports NaNs with graphs and overlap.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, overlap_moe_expert_parallel_comm: true, cuda_graph_modules: [moe]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, overlap_moe_expert_parallel_comm: true, cuda_graph_modules: [attn, moe_router]}
    ```

    ## Fix
    Capture `attn` / `moe_router` only when overlapping expert-parallel communication.
    """

    code = "GD207"
    name = "moe-graph-with-a2a-overlap"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "cuda_graph_modules {modules!r} captures moe/mlp with overlap_moe_expert_parallel_comm"
    fix_template = "Remove moe and mlp from cuda_graph_modules or turn off overlap_moe_expert_parallel_comm"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        mods = ctx.graph.modules
        if ctx.value("overlap_moe_expert_parallel_comm") and ctx.graph.impl == Impl.TRANSFORMER_ENGINE \
                and ("moe" in mods or "mlp" in mods):
            yield Hit(t("cuda_graph_modules", "cuda_graph_scope", "overlap_moe_expert_parallel_comm"),
                      {"modules": list(mods)})


class LocalImplAddsMoeRouterGraph(Rule):
    """## What it does
    Reports that the local impl silently adds `moe_router` / `moe_preprocess` when only one of them
    is listed.

    ## Why is this bad?
    The local impl cannot capture them separately (`transformer_config.py:2472-2482`), so the graph
    covers more than you asked for, which matters for host syncs in the preprocess step.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, num_moe_experts: 8, cuda_graph_modules: [moe_router]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local, num_moe_experts: 8, cuda_graph_modules: [moe_router, moe_preprocess]}
    ```

    ## Fix
    List both modules so that the configuration says what is captured.
    """

    code = "GD208"
    name = "local-impl-adds-moe-router-graph"
    severity = Severity.INFO
    fix = FixAvailability.ALWAYS
    template = "cuda_graph_impl='local' also captures {added} (moe_router and moe_preprocess go together)"
    fix_template = "List {added} in cuda_graph_modules explicitly"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.auto_added:
            yield Hit(t("cuda_graph_modules", "cuda_graph_scope"), {"added": ", ".join(ctx.graph.auto_added)})
