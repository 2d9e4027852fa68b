"""GD312: fp16's dynamic loss scaler under a full-iteration graph, judged against the megatron-core installed here
(graphdoctor.rules.scaler reads its DynamicGradScaler.update with `ast`; megatron is never imported).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import given
from graphdoctor.checks.gd2xx_moe_dispatch import graphed_runs

from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity
from graphdoctor.rules.scaler import installed_scaler

FAMILY = "environment"

BRIDGE_FP16_KEYS = ("mixed_precision.fp16", "mixed_precision", "optimizer.fp16")
"""Where a Bridge config's optimizer fp16 comes from, first found first (BridgeGuards.fp16)."""


def fp16_fields(ctx: CheckContext) -> tuple[str, ...] | None:
    """The keys that make the run train in fp16 (possibly none: a default), or None when it does not: graphdoctor's
    `run.dtype` (which owns bf16/fp16, DiffConfig), a Bridge config's optimizer precision, else `fp16`."""
    dtype = ctx.run.get("dtype")
    if dtype is not None:
        return ("run.dtype",) if dtype == "fp16" else None
    if ctx.bridge is not None and ctx.bridge.guards.fp16 is not None:
        guards = ctx.bridge.guards
        return next(((key,) for key in BRIDGE_FP16_KEYS if key in guards.given), ()) if guards.fp16 else None
    return given(ctx, "fp16") if ctx.value("fp16") else None


def static_loss_scale(ctx: CheckContext) -> bool:
    """A static loss scale is set (Megatron's ConstantGradScaler): `run.loss_scale`, `--loss-scale`, or a Bridge
    config's `optimizer.loss_scale` as its mixed_precision leaves it. Megatron's test is `if config.loss_scale`."""
    if ctx.bridge is not None:
        return ctx.bridge.guards.loss_scale is not None
    return bool(ctx.run.get("loss_scale") or ctx.arg("loss_scale"))


def full_iteration_fields(ctx: CheckContext) -> tuple[str, ...] | None:
    """The keys that choose a full-iteration graph (the deprecated `full_iteration` module included), or None."""
    if ctx.bridge is not None:
        guards = ctx.bridge.guards
        if not guards.full_iteration:
            return None
        modules = ("model.cuda_graph_modules", "model.cuda_graph_scope") if guards.cuda_graph_impl == Impl.LOCAL else ()
        return ("model.cuda_graph_impl", *(key for key in modules if key in guards.given))
    if ctx.graph.impl == Impl.FULL_ITERATION:
        legacy = ("enable_cuda_graph", "cuda_graph_modules", "cuda_graph_scope") if ctx.graph.migrated_impl else ()
        return given(ctx, "cuda_graph_impl", *legacy)
    if ctx.megatron_lm:
        return None
    # a graphdoctor run file: the impls `graphdoctor diff` runs (run.impls, or its defaults)
    return next((run.fields for run in graphed_runs(ctx) if run.impl == Impl.FULL_ITERATION), None)


class Fp16DynamicLossScaleInFullIteration(Rule):
    """## What it does
    Flags fp16 training with Megatron's dynamic loss scaler (no static loss scale: `--loss-scale`,
    `run.loss_scale`, Megatron-Bridge's `optimizer.loss_scale`) under a full-iteration graph
    (`cuda_graph_impl: full_iteration`, or the deprecated `full_iteration` module) when the megatron-core
    installed here rebinds its scale tensor: its `DynamicGradScaler.update` assigns `self._scale` (read with
    `ast` from `megatron/core/optimizer/grad_scaler.py`, never imported).

    ## Why is this bad?
    `DynamicGradScaler.update` replaces `self._scale` by a new tensor on every back-off
    (`self._scale = torch.max(self._scale * self.backoff_factor, self.min_scale)`, `grad_scaler.py:143` in
    megatron-core 0.19.2) and every growth (`self._scale = self._scale * self.growth_factor`, `:153`). A
    full-iteration graph captures the loss scaling with the step: `config.grad_scale_func(loss)` is
    `optimizer.scale_loss(loss)`, `get_loss_scale() * loss`, a multiplication by the scale tensor read at
    capture. After the first rebinding eager scales by the new tensor and every replay by the old one, which is
    freed: the graph reads memory the caching allocator has handed to something else. Nothing fails. Measured
    on an H200 (megatron-core 0.19.2, fp16): the early steps overflow and are skipped; eager and `local` take
    their first optimizer update at step 15, `full_iteration` at step 16, and the losses differ from then on.
    `local` and `transformer_engine` graphs keep the loss scaling outside the graph, bf16 has no loss scaler,
    and a static loss scale (Megatron's `ConstantGradScaler`) never rebinds.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: full_iteration}
    run: {dtype: fp16}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: full_iteration}
    run: {dtype: fp16, loss_scale: 4096}
    ```

    ## Fix
    Train in bf16, set a static loss scale (`--loss-scale`, `run.loss_scale`, Bridge's `optimizer.loss_scale`),
    or graph with `local` or `transformer_engine`, which keep the loss scaling outside the graph.

    ## Known problems
    Judges the megatron-core installed where graphdoctor runs (graphdoctor depends on it, and `graphdoctor
    diff` trains with it), not the training machine's: `--target` does not record it. Without megatron-core the
    rule assumes the scaler rebinds, as every release up to 0.19.2 does. Only assignments in `update` are read:
    a release that updates the scale in place (`copy_`) is taken as safe. On a Megatron-Bridge config a
    `mixed_precision` (a recipe name or a mapping) writes its own `fp16` and `loss_scale` over the optimizer's
    (`MixedPrecisionConfig.setup`), so `optimizer.loss_scale: 4096` beside `mixed_precision: fp16_mixed` is
    still the dynamic scaler, and is flagged. A graphdoctor run file that sets no graph runs diff's default
    impls, `full_iteration` among them. `graphdoctor diff` sees the rebinding itself (GD522).
    """

    code = "GD312"
    name = "fp16-dynamic-loss-scale-in-full-iteration"
    severity = Severity.WARNING
    fix = FixAvailability.ALWAYS
    template = ("fp16 with Megatron's dynamic loss scaler under a full_iteration graph: {scaler}, and the graph "
                "keeps multiplying the loss by the scale tensor it read at capture, so the graphed run diverges "
                "from eager")
    fix_template = ("Train in bf16, set a static loss scale (--loss-scale, run.loss_scale), or graph with local / "
                    "transformer_engine, which keep the loss scaling outside the graph")

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        fp16 = fp16_fields(ctx)
        if fp16 is None or static_loss_scale(ctx):
            return
        graph = full_iteration_fields(ctx)
        if graph is None:
            return
        scaler = installed_scaler()
        if scaler.rebinds:
            yield Hit(tuple(dict.fromkeys((*fp16, *graph))), {"scaler": scaler.why})


__all__ = ["Fp16DynamicLossScaleInFullIteration", "fp16_fields", "full_iteration_fields", "static_loss_scale"]
