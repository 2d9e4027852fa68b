"""GD2xx MoE token dispatch inside a graph: the host copies of token counts that megatron-core 0.19.2's
allgather and dropless alltoall dispatchers make, which Megatron's TransformerConfig does not reject.

Sources (megatron-core 0.19.2): moe/token_dispatcher.py:317, :449-466, :612-615, :695, :913-950;
moe/moe_utils.py:1185; NVIDIA/Megatron-LM#1598 (the maintainers' answer: capture attention only, which
under `local` still graphs the whole GPT layer: transformer/transformer_layer.py:541-567, GD219).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from graphdoctor.checks import given

from graphdoctor.config.diff_config import IMPLS
from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "moe"

ALLGATHER_HOST_COPY = "megatron/core/transformer/moe/token_dispatcher.py:317"
"""MoEAllGatherTokenDispatcher.dispatch_postprocess: `self.local_map.sum(dim=0).long().cpu()`, then
`.sum().item()` at :323 (dropless or not)."""

ALLTOALL_HOST_COPY = "megatron/core/transformer/moe/token_dispatcher.py:695"
"""MoEAlltoAllTokenDispatcher.token_dispatch: `_maybe_dtoh_and_synchronize("before_ep_alltoall")`, whose
`tensor.to("cpu", non_blocking=True)` into pageable memory is moe/moe_utils.py:1185 and whose
`self.d2h_event.synchronize()` is token_dispatcher.py:950 (dropless only)."""

ALLTOALL_SYNC_ASSERT = "megatron/core/transformer/moe/token_dispatcher.py:612"
"""`cuda_sync_point must be after cuda_dtoh_point.`: a capacity factor without padding syncs before
permutation 1, but whole-layer graphs move the host copies to before_ep_alltoall (:460-465)."""



@dataclass(frozen=True, slots=True)
class GraphedRun:
    """One graph implementation the configuration will run, with where it was declared."""

    impl: str
    modules: tuple[str, ...]
    fields: tuple[str, ...]
    """The run-file keys that declare it (`transformer.cuda_graph_impl`, `run.impls`, ...)."""

    @property
    def dispatch_captured(self) -> bool:
        """The token dispatch runs inside the graph: full_iteration, a whole layer, `moe` under
        transformer_engine, or `attn` under local (megatron-core 0.19.2's TransformerLayer, which the GPT
        specs build for MoE too, graphs its whole forward when the modules contain `attn`:
        transformer_layer.py:556-560, module.py:365-367; GD219)."""
        if self.impl == Impl.FULL_ITERATION:
            return True
        if self.impl == Impl.LOCAL:
            return not self.modules or "attn" in self.modules
        return self.impl == Impl.TRANSFORMER_ENGINE and (not self.modules or "moe" in self.modules)


def _run_list(value: object) -> list[str]:
    if isinstance(value, str):
        return [s.strip() for s in value.split(",") if s.strip()]
    if isinstance(value, list | tuple):
        return [str(s) for s in value]
    return []


def graphed_runs(ctx: CheckContext) -> list[GraphedRun]:
    """The graphed runs of a run file: `transformer.cuda_graph_impl` (training), and the `run.impls`
    that `graphdoctor diff` runs with `run.cuda_graph_modules` (the `transformer:` list wins, as in
    diff's TransformerConfig); a `run:` section without `impls` runs diff's default impls."""
    runs: list[GraphedRun] = []
    if ctx.graph.enabled:
        runs.append(GraphedRun(ctx.graph.impl, ctx.graph.modules,
                               given(ctx, "cuda_graph_impl", "enable_cuda_graph", "external_cuda_graph",
                                     "cuda_graph_modules", "cuda_graph_scope")))
    if "impls" in ctx.run or (ctx.run and not ctx.graph.enabled):
        if "cuda_graph_modules" in ctx.transformer:
            modules, where = ctx.graph.modules, given(ctx, "cuda_graph_modules")
        else:
            modules = tuple(_run_list(ctx.run.get("cuda_graph_modules")))
            where = ("run.cuda_graph_modules",) if "cuda_graph_modules" in ctx.run else ()
        impls = _run_list(ctx.run["impls"]) if "impls" in ctx.run else list(IMPLS)
        declared = ("run.impls",) if "impls" in ctx.run else ()
        for impl in impls:
            if impl == ctx.graph.impl or impl not in IMPLS:
                continue
            if impl == Impl.FULL_ITERATION:
                runs.append(GraphedRun(impl, (), declared))
            else:
                runs.append(GraphedRun(impl, _local_auto_added(impl, modules), (*declared, *where)))
    return runs


def _local_auto_added(impl: str, modules: tuple[str, ...]) -> tuple[str, ...]:
    """The local impl captures moe_router and moe_preprocess together (transformer_config.py:2472-2482)."""
    if impl != Impl.LOCAL or not {"moe_router", "moe_preprocess"} & set(modules):
        return modules
    return (*modules, *(m for m in ("moe_router", "moe_preprocess") if m not in modules))


def per_layer_runs(ctx: CheckContext) -> list[GraphedRun]:
    """The `local` / `transformer_engine` runs among graphed_runs (the MoE scope rules' subject)."""
    return [run for run in graphed_runs(ctx) if run.impl in (Impl.LOCAL, Impl.TRANSFORMER_ENGINE)]


def dispatch_host_copy(ctx: CheckContext) -> tuple[str, str] | None:
    """(Megatron file:line, what it does) of the first host copy in the captured token dispatch,
    or None when the dispatcher has none (alltoall with drop-and-pad) or is not covered (flex)."""
    dispatcher = ctx.value("moe_token_dispatcher_type")
    drop_and_pad = ctx.capacity_factor is not None and bool(ctx.value("moe_pad_expert_input_to_capacity"))
    if dispatcher == "allgather":
        return ALLGATHER_HOST_COPY, "tokens_per_expert .cpu() and .item() of the token counts"
    if dispatcher == "alltoall" and not drop_and_pad:
        if ctx.capacity_factor is not None:
            return ALLTOALL_SYNC_ASSERT, "assertion: capacity factor without padding syncs before permutation 1"
        return ALLTOALL_HOST_COPY, "non_blocking copy of token counts to pageable host memory (moe_utils.py:1185)"
    return None


class TokenDispatchHostCopyInGraph(Rule):
    """## What it does
    Flags an MoE model whose token dispatch is captured (`full_iteration`, a whole-layer `local` or
    `transformer_engine` graph, `local` with `attn`, which graphs the whole GPT layer in megatron-core
    0.19.2 (GD219), or the `transformer_engine` `moe` scope) while its dispatcher copies token counts to the
    host: the allgather dispatcher always (`token_dispatcher.py:317`, `.cpu()` then `.item()`), the
    alltoall dispatcher unless it drops and pads (`token_dispatcher.py:695` ->
    `moe_utils.py:1185`, a non-blocking copy into pageable memory, then `d2h_event.synchronize()` at
    `:950`). Reads `transformer.cuda_graph_impl` and the `run.impls` / `run.cuda_graph_modules` that
    `graphdoctor diff` runs.

    ## Why is this bad?
    Dropless routing sends a data-dependent number of tokens to each expert; the dispatcher reads the
    counts on the host to size its buffers. Inside a capture that copy fails ("Cannot copy between
    CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned",
    cudaErrorStreamCaptureUnsupported), and even a pinned copy would bake one step's counts into the
    graph. Megatron's TransformerConfig rejects only the `moe` scope for dropless MoE (GD205), so
    whole-layer graphs pass validation and fail at capture. With a capacity factor but no padding
    the alltoall dispatcher fails earlier, on `cuda_sync_point must be after cuda_dtoh_point.`
    (`token_dispatcher.py:612-615`), because whole-layer graphs move its host copies later
    (`:460-465`). NVIDIA/Megatron-LM#1598: the answer is to capture attention only; no Megatron
    release up to 0.19.2 makes dropless dispatch capturable. Under `local`, `attn` is not such a
    scope for GPT models: `get_gpt_layer_local_spec` and the TE spec build `TransformerLayer` for MoE
    too (`gpt_layer_specs.py:467-470`), whose `create_mcore_cudagraph_manager`
    (`transformer_layer.py:541-567`) makes one whole-layer graph when the modules contain `attn`; on
    the H200 `local` + `attn` fails at `token_dispatcher.py:317` like the whole layer.

    ## Example
    ```yaml
    transformer: {num_moe_experts: 4, moe_router_topk: 2, add_bias_linear: false}
    run: {impls: [local], cuda_graph_modules: []}
    ```

    ## Use instead
    ```yaml
    transformer: {num_moe_experts: 4, moe_router_topk: 2, add_bias_linear: false}
    run: {impls: [transformer_engine], cuda_graph_modules: [attn, moe_router, moe_preprocess]}
    ```

    ## Fix
    Stop the graph before token dispatch: `transformer_engine` with `[attn]` or
    `[attn, moe_router, moe_preprocess]` (`local` has no such scope for GPT layers: `attn` graphs
    the whole layer, `moe_router` / `moe_preprocess` graph nothing, GD219). Or drop and pad with the alltoall
    dispatcher (`moe_token_dispatcher_type: alltoall`, `moe_expert_capacity_factor: 1.0`,
    `moe_pad_expert_input_to_capacity: true`), which changes the model (tokens over capacity are
    dropped).

    ## Known problems
    A warning, like the other capture hazards (GD4xx): errors are kept for configurations that
    megatron-core refuses, and it accepts this one; the capture fails. The flex dispatcher is not covered. The rule reads the dispatcher code of megatron-core 0.19.2.
    """

    code = "GD217"
    name = "token-dispatch-host-copy-in-graph"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = ("capture will fail: {impl} graph{scope} captures the {dispatcher} MoE token dispatch, which copies token counts "
                "to the host at {location} ({what})")
    fix_template = ("Graph only up to token dispatch with transformer_engine ([attn] or "
                    "[attn, moe_router, moe_preprocess]; local graphs whole GPT layers, so local [attn] does "
                    "not stop before dispatch), or use the alltoall dispatcher with "
                    "moe_expert_capacity_factor and moe_pad_expert_input_to_capacity")

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if not ctx.is_moe:
            return
        copy = dispatch_host_copy(ctx)
        if copy is None:
            return
        location, what = copy
        moe_fields = given(ctx, "num_moe_experts", "moe_token_dispatcher_type", "moe_expert_capacity_factor",
                           "moe_pad_expert_input_to_capacity")
        for run in graphed_runs(ctx):
            if not run.dispatch_captured:
                continue
            scope = "" if run.impl == Impl.FULL_ITERATION else \
                (f" of {list(run.modules)}" if run.modules else " of the whole layer")
            if run.impl == Impl.LOCAL and run.modules:
                scope += " (the whole GPT layer under local)"
            yield Hit((*run.fields, *moe_fields),
                      {"impl": run.impl, "scope": scope, "dispatcher": ctx.value("moe_token_dispatcher_type"),
                       "location": location, "what": what})
