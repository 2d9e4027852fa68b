"""GD2xx MoE with generalized tensor parallelism (GTP): the shared-expert recompute that megatron-core
0.19.2 refuses under local CUDA graphs at fp8/fp4.

Sources: transformer_config.py:2521-2594 (the selective-recompute branch), model_parallel_config.py:10-42.
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import given

from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "moe"


def gtp_weight_remat_size(ctx: CheckContext) -> int:
    """After model_parallel_config.py:10-42: tensor_parallel_num_weight_shards // TP when given."""
    shards = ctx.value("tensor_parallel_num_weight_shards")
    tp = ctx.value("tensor_model_parallel_size") or 1
    if isinstance(shards, int) and not isinstance(shards, bool) and shards >= tp and shards % tp == 0:
        return shards // tp
    size = ctx.value("gtp_weight_remat_size")
    return size if isinstance(size, int) else 1


class GtpSharedExpertRecomputeInLocalGraph(Rule):
    """## What it does
    Flags selective recompute of `shared_experts` with generalized tensor parallelism
    (`gtp_weight_remat_size > 1`, or `tensor_parallel_num_weight_shards` above the TP size), fp8 or
    fp4, a shared expert that is not overlapped, and `local` CUDA graphs that capture it (whole
    layer, `moe` or `moe_router`).

    ## Why is this bad?
    Megatron asserts `GTP + local CUDA graphs that capture shared_experts (moe_router/moe scope)
    cannot recompute it under fp8/fp4: te_checkpoint requires .backward(), but the local fwd-graph
    warmup uses .grad().` (`transformer_config.py:2574-2594`), so the run never starts.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, num_moe_experts: 8, moe_shared_expert_intermediate_size: 512,
                  fp8: e4m3, gtp_weight_remat_size: 2, recompute_granularity: selective,
                  recompute_modules: [shared_experts]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local, num_moe_experts: 8, moe_shared_expert_intermediate_size: 512,
                  fp8: e4m3, gtp_weight_remat_size: 2, recompute_granularity: selective,
                  recompute_modules: [core_attn], cuda_graph_modules: [attn]}
    ```

    ## Fix
    Drop `shared_experts` from `recompute_modules` (GTP-shard and offload instead), graph only
    `attn`, or use `cuda_graph_impl: full_iteration`.
    """

    code = "GD218"
    name = "gtp-shared-expert-recompute-in-local-graph"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = ("shared_experts is recomputed under fp8/fp4 with GTP (gtp_weight_remat_size={gtp}) while local "
                "graphs{scope} capture the shared expert")
    fix_template = "Drop shared_experts from recompute_modules, or use cuda_graph_impl='full_iteration'"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        graph = ctx.graph
        if graph.impl != Impl.LOCAL or ctx.recompute_granularity != "selective":
            return
        gtp = gtp_weight_remat_size(ctx)
        quantized = ctx.value("fp8") is not None or ctx.value("fp4") is not None
        shared = ctx.value("moe_shared_expert_intermediate_size") is not None \
            and not ctx.value("moe_shared_expert_overlap")
        captured = graph.whole_layer or "moe" in graph.modules or "moe_router" in graph.modules
        if gtp > 1 and quantized and shared and captured and "shared_experts" in ctx.recompute_modules:
            scope = " of the whole layer" if graph.whole_layer else f" of {list(graph.modules)}"
            yield Hit(given(ctx, "cuda_graph_impl", "cuda_graph_modules", "recompute_modules",
                            "gtp_weight_remat_size", "tensor_parallel_num_weight_shards"),
                      {"gtp": gtp, "scope": scope})
