"""GD220: activation recompute through CheckpointWithoutOutput inside megatron-core 0.19.2's local
CUDA graphs (parameters used only by the recompute get no gradient on replay).

Sources (megatron-core 0.19.2): tensor_parallel/random.py:725 (CheckpointWithoutOutput),
transformer/transformer_layer.py:633, :766; NVIDIA/Megatron-LM#6373 and #3919 (recompute with local
graphs). Evaluation replaying training graphs is GD402 (checks/gd4xx_hazards.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import selective_recompute
from graphdoctor.checks.gd2xx_moe_dispatch import graphed_runs

from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "recompute"

HIDDEN_CHECKPOINT = "megatron/core/tensor_parallel/random.py:725"
"""CheckpointWithoutOutput: its outer autograd graph has no edges to parameters used only by the
recompute function (fixed for local graphs by NVIDIA/Megatron-LM#6373, after 0.19.2)."""

CHECKPOINT_WITHOUT_OUTPUT_MODULES: dict[str, tuple[str, ...]] = {
    "layernorm": ("attn", "mlp"),
    "moe_act": ("moe",),
    "mla_up_proj": ("attn",),
    "gdn_norm_out": ("mamba",),
}
"""recompute_modules megatron-core 0.19.2 recomputes through CheckpointWithoutOutput, with the
cuda_graph_modules scopes that capture them (a whole-layer graph captures every one)."""


class RecomputeOnlyParameterInLocalGraph(Rule):
    """## What it does
    Flags selective recompute of a module that megatron-core 0.19.2 recomputes through
    `CheckpointWithoutOutput` (`layernorm`, `moe_act`, `mla_up_proj`, `gdn_norm_out`) inside a `local`
    graph that captures it (whole layer, or the scope holding it).

    ## Why is this bad?
    `CheckpointWithoutOutput` (`tensor_parallel/random.py:725`) runs the function without autograd and
    recomputes it in backward; its outer graph has no edges to parameters used only by the recompute
    (the layernorm weights at `transformer_layer.py:633` and `:766`). The local graph's captured backward
    takes its inputs from those edges, so such parameters get no gradient on replay while eager trains
    them (fixed after 0.19.2 by NVIDIA/Megatron-LM#6373; #3919 fixed recompute with training graphs).

    ## Example
    ```yaml
    transformer: {recompute_granularity: selective, recompute_modules: [layernorm]}
    run: {impls: [local]}
    ```

    ## Use instead
    ```yaml
    transformer: {recompute_granularity: selective, recompute_modules: [core_attn]}
    run: {impls: [local]}
    ```

    ## Fix
    Recompute modules outside the captured scope, use full_iteration graphs, or upgrade to a
    megatron-core with NVIDIA/Megatron-LM#6373.
    """

    code = "GD220"
    name = "recompute-only-parameter-in-local-graph"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = ("recompute_modules {modules} recomputed through CheckpointWithoutOutput inside a local graph: "
                f"their parameters get no gradient on replay ({HIDDEN_CHECKPOINT})")
    fix_template = "Recompute these modules outside the local graph's scope or use full_iteration graphs"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        selective = selective_recompute(ctx)
        if selective is None:
            return
        modules, recompute_keys = selective
        hidden = [m for m in modules if m in CHECKPOINT_WITHOUT_OUTPUT_MODULES]
        for run in graphed_runs(ctx):
            if run.impl != Impl.LOCAL:
                continue
            captured = [m for m in hidden if not run.modules
                        or set(CHECKPOINT_WITHOUT_OUTPUT_MODULES[m]) & set(run.modules)]
            if captured:
                keys = (*recompute_keys, *run.fields)
                yield Hit(tuple(dict.fromkeys(keys)), {"modules": captured})
                return


__all__ = ["CHECKPOINT_WITHOUT_OUTPUT_MODULES", "RecomputeOnlyParameterInLocalGraph"]
