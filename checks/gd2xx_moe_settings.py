"""GD2xx MoE settings Megatron enforces next to the capture scopes: capacity padding, the flex
dispatcher, expert-parallel A2A overlap and delay_wgrad_compute (incl. the TE versions they need).

Sources: transformer_config.py:1463-1690, :2669-2757; training/arguments.py:1822-1848 (A11).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import t

from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "moe"


class PadToCapacityWithoutCapacityFactor(Rule):
    """## What it does
    Flags `moe_pad_expert_input_to_capacity` without a (non-negative) `moe_expert_capacity_factor`.

    ## Why is this bad?
    Padding needs a capacity. Megatron raises `moe_expert_capacity_factor must be set to use
    moe_pad_expert_input_to_capacity` (`transformer_config.py:1684-1688`; a negative factor is turned
    into None first, `:1661`). Drop-and-pad is also what the `moe` graph scope requires (GD205).

    ## Example
    ```yaml
    transformer: {num_moe_experts: 8, moe_pad_expert_input_to_capacity: true}
    ```

    ## Use instead
    ```yaml
    transformer: {num_moe_experts: 8, moe_pad_expert_input_to_capacity: true, moe_expert_capacity_factor: 1.0}
    ```

    ## Fix
    Set `moe_expert_capacity_factor` (e.g. 1.0).
    """

    code = "GD209"
    name = "pad-to-capacity-without-capacity-factor"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "moe_pad_expert_input_to_capacity=True but moe_expert_capacity_factor={factor!r}"
    fix_template = "Set moe_expert_capacity_factor to a non-negative value"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.value("moe_pad_expert_input_to_capacity") and ctx.capacity_factor is None:
            yield Hit(t("moe_pad_expert_input_to_capacity", "moe_expert_capacity_factor"),
                      {"factor": ctx.value("moe_expert_capacity_factor")})


class FlexDeepepWithPadToCapacity(Rule):
    """## What it does
    Flags the flex token dispatcher with the DeepEP backend (the default backend) together with
    `moe_pad_expert_input_to_capacity`.

    ## Why is this bad?
    `Flex token dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity`
    (`transformer_config.py:1600-1606`), so drop-pad MoE graphs cannot use it.

    ## Example
    ```yaml
    transformer: {num_moe_experts: 8, moe_token_dispatcher_type: flex, moe_expert_capacity_factor: 1.0,
                  moe_pad_expert_input_to_capacity: true}
    ```

    ## Use instead
    ```yaml
    transformer: {num_moe_experts: 8, moe_token_dispatcher_type: alltoall, moe_expert_capacity_factor: 1.0,
                  moe_pad_expert_input_to_capacity: true}
    ```

    ## Fix
    Use the alltoall dispatcher, or another flex backend.
    """

    code = "GD210"
    name = "flex-deepep-with-pad-to-capacity"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "moe_token_dispatcher_type='flex' with the deepep backend cannot pad expert input to capacity"
    fix_template = "Use moe_token_dispatcher_type='alltoall' or turn off moe_pad_expert_input_to_capacity"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        deepep = ctx.value("moe_enable_deepep") or ctx.value("moe_flex_dispatcher_backend") == "deepep"
        if ctx.value("moe_token_dispatcher_type") == "flex" and ctx.value("moe_pad_expert_input_to_capacity") \
                and deepep:
            yield Hit(t("moe_token_dispatcher_type", "moe_pad_expert_input_to_capacity", "moe_flex_dispatcher_backend"))


def _a2a_overlap_problems(ctx: CheckContext) -> list[tuple[str, str]]:
    """(field, reason) pairs for transformer_config.py:2685-2716."""
    v = ctx.value
    checks = [
        ("pipeline_model_parallel_size", v("pipeline_model_parallel_size") > 1
         and v("virtual_pipeline_model_parallel_size") is None, "pipeline parallelism without virtual stages"),
        ("expert_model_parallel_size", not v("expert_model_parallel_size") > 1, "expert_model_parallel_size <= 1"),
        ("moe_token_dispatcher_type", v("moe_token_dispatcher_type") not in ("alltoall", "flex"),
         "dispatcher is not alltoall/flex"),
        ("recompute_granularity", v("recompute_granularity") == "full", "full recomputation"),
        ("recompute_method", v("recompute_method") is not None, "recompute_method is set"),
        ("recompute_num_layers", v("recompute_num_layers") is not None, "recompute_num_layers is set"),
        ("recompute_modules", "moe" in ctx.recompute_modules, "moe is recomputed"),
        ("bf16", not (v("bf16") or v("fp16")), "neither bf16 nor fp16"),
        ("moe_shared_expert_overlap", bool(v("moe_shared_expert_overlap")), "moe_shared_expert_overlap is on"),
        ("mtp_num_layers", v("mtp_num_layers") not in (None, 0, 1), "more than one MTP layer"),
    ]
    return [(name, reason) for name, bad, reason in checks if bad]


class A2aOverlapPrerequisitesMissing(Rule):
    """## What it does
    Flags `overlap_moe_expert_parallel_comm` (the EP A2A overlap that partial MoE graphs are often
    combined with) when its prerequisites are missing: expert parallelism > 1, alltoall/flex
    dispatcher, no full recompute / recompute method / layer count, no `moe` recompute, bf16 or fp16,
    no shared-expert overlap, at most one MTP layer, virtual stages with PP.

    ## Why is this bad?
    Megatron asserts each of these (`transformer_config.py:2685-2716`), so the run never starts.

    ## Example
    ```yaml
    transformer: {num_moe_experts: 8, overlap_moe_expert_parallel_comm: true}
    ```

    ## Use instead
    ```yaml
    transformer: {num_moe_experts: 8, overlap_moe_expert_parallel_comm: true, expert_model_parallel_size: 2,
                  moe_token_dispatcher_type: alltoall, bf16: true}
    ```

    ## Fix
    Satisfy each listed prerequisite, or turn the overlap off.
    """

    code = "GD211"
    name = "a2a-overlap-prerequisites-missing"
    severity = Severity.ERROR
    fix = FixAvailability.NONE
    template = "overlap_moe_expert_parallel_comm is on but: {reasons}"
    fix_template = "Fix the listed settings or turn off overlap_moe_expert_parallel_comm"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if not ctx.value("overlap_moe_expert_parallel_comm"):
            return
        problems = _a2a_overlap_problems(ctx)
        if problems:
            yield Hit(t("overlap_moe_expert_parallel_comm", *(name for name, _ in problems)),
                      {"reasons": "; ".join(reason for _, reason in problems)})


class DelayWgradWithoutA2aOverlap(Rule):
    """## What it does
    Flags `delay_wgrad_compute` without `overlap_moe_expert_parallel_comm`.

    ## Why is this bad?
    Delayed weight-gradient compute only exists for the A2A overlap schedule:
    `overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute`
    (`transformer_config.py:2748-2752`).

    ## Example
    ```yaml
    transformer: {delay_wgrad_compute: true}
    ```

    ## Use instead
    ```yaml
    transformer: {delay_wgrad_compute: false}
    ```

    ## Fix
    Turn off `delay_wgrad_compute`, or enable the A2A overlap (see GD211 for its prerequisites).
    """

    code = "GD212"
    name = "delay-wgrad-without-a2a-overlap"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "delay_wgrad_compute=True without overlap_moe_expert_parallel_comm"
    fix_template = "Turn off delay_wgrad_compute or enable overlap_moe_expert_parallel_comm"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.value("delay_wgrad_compute") and not ctx.value("overlap_moe_expert_parallel_comm"):
            yield Hit(t("delay_wgrad_compute", "overlap_moe_expert_parallel_comm"))


def _wgrad_in_graph_scope(ctx: CheckContext) -> bool:
    """TECudaGraphHelper's `wgrad_in_graph_scope` (cuda_graphs.py:2538-2542, arguments.py:1829-1833):
    graphed attn, or a moe_router graph that holds a non-overlapped shared expert."""
    mods = ctx.graph.modules
    return "attn" in mods or ("moe_router" in mods and ctx.value("moe_shared_expert_intermediate_size") is not None
                              and not ctx.value("moe_shared_expert_overlap"))


class DelayWgradGraphWithOldTe(Rule):
    """## What it does
    Flags `delay_wgrad_compute` with `cuda_graph_impl: transformer_engine` when the installed
    Transformer Engine is older than 2.10 (error), or older than 2.12 while the partial graphs hold
    weight gradients: `attn` in `cuda_graph_modules`, or `moe_router` with a shared expert that is not
    overlapped (warning).

    ## Why is this bad?
    TransformerConfig asserts `TE version >= 2.10.0 is required for delay_wgrad_compute with partial
    cuda graph` (`transformer_config.py:2753-2757`). When the graphed modules hold weight gradients,
    TECudaGraphHelper also captures separate weight-gradient graphs into the `_order` it hands to TE's
    `make_graphed_callables` (`cuda_graphs.py:2537-2545`), which needs TE 2.12: Megatron-LM asserts
    `CUDA graph with delay_wgrad_compute requires TE version >= 2.12.0.` (`arguments.py:1834-1838`).

    ## Example
    ```yaml
    # facts: te_version=2.9.0
    transformer: {cuda_graph_impl: transformer_engine, delay_wgrad_compute: true}
    ```

    ## Use instead
    ```yaml
    # facts: te_version=2.12.0
    transformer: {cuda_graph_impl: transformer_engine, delay_wgrad_compute: true}
    ```

    ## Fix
    Upgrade Transformer Engine (>= 2.12 covers both gates), move attn / the shared expert out of the
    graph, or turn off `delay_wgrad_compute`.

    ## Known problems
    The version checked is the training machine's (`check --target`; without a target the rule
    reports "not checked"); a missing TE is reported by GD304. Megatron-LM asserts the 2.12 gate only with `--overlap-grad-reduce`, which a run file cannot
    declare, hence a warning; a launch line with `--overlap-grad-reduce` gets the error from GD215
    instead.
    """

    code = "GD213"
    name = "delay-wgrad-graph-with-old-te"
    severity = Severity.ERROR
    fix = FixAvailability.NONE
    machine_facts = ("te_version",)
    machine_question = "which Transformer Engine is installed there?"
    template = "delay_wgrad_compute with transformer_engine graphs{scope} needs TE >= {need}, found {te}"
    fix_template = "Upgrade transformer_engine to >= {need} or turn off delay_wgrad_compute"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        te = ctx.facts.te_version
        if not ctx.value("delay_wgrad_compute") or ctx.graph.impl != Impl.TRANSFORMER_ENGINE or te is None:
            return
        wgrad = _wgrad_in_graph_scope(ctx)
        scope = " that hold weight gradients" if wgrad else ""
        need = "2.12" if wgrad else "2.10"
        fields = t("delay_wgrad_compute", "cuda_graph_impl")
        if not ctx.facts.te_at_least("2.10.0"):
            yield Hit(fields, {"scope": scope, "need": need, "te": te})
        elif wgrad and not ctx.facts.te_at_least("2.12.0") and not (ctx.megatron_lm and ctx.arg("overlap_grad_reduce")):
            yield Hit((*fields, *t("cuda_graph_modules")), {"scope": scope, "need": need, "te": te}, Severity.WARNING)


class ExpertParallelWithoutExperts(Rule):
    """## What it does
    Flags `expert_model_parallel_size > 1` without `num_moe_experts`.

    ## Why is this bad?
    `num_moe_experts must be non None to use expert-parallel.` (`transformer_config.py:1468-1469`).

    ## Example
    ```yaml
    transformer: {expert_model_parallel_size: 2}
    ```

    ## Use instead
    ```yaml
    transformer: {expert_model_parallel_size: 2, num_moe_experts: 8}
    ```

    ## Fix
    Set `num_moe_experts`, or expert_model_parallel_size 1.
    """

    code = "GD214"
    name = "expert-parallel-without-experts"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "expert_model_parallel_size={ep} but num_moe_experts is not set"
    fix_template = "Set num_moe_experts or expert_model_parallel_size=1"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.value("expert_model_parallel_size") > 1 and ctx.value("num_moe_experts") is None:
            yield Hit(t("expert_model_parallel_size", "num_moe_experts"), {"ep": ctx.value("expert_model_parallel_size")})


def _wgrad_graph_problems(ctx: CheckContext) -> list[str]:
    """Megatron-LM arguments.py:1822-1848 (A11)."""
    v, te = ctx.value, ctx.facts.te_at_least
    mods = ctx.graph.modules
    problems: list[str] = []
    if v("transformer_impl") != "transformer_engine":
        problems.append("transformer_impl is not transformer_engine")
    fusion = ctx.arg("gradient_accumulation_fusion")
    if ctx.arg("overlap_grad_reduce"):
        if not te("2.8.0"):
            problems.append("overlap_grad_reduce needs TE >= 2.8")
        in_graph = _wgrad_in_graph_scope(ctx)
        if in_graph and not te("2.12.0"):
            problems.append("wgrad inside the graph needs TE >= 2.12")
        if in_graph and not fusion:
            problems.append("wgrad inside the graph needs gradient_accumulation_fusion")
        if in_graph and "attn" in mods and (v("add_bias_linear") or v("add_qkv_bias")):
            problems.append("graphed attn with delayed wgrad does not support attention bias")
    if not fusion and not te("2.7.0"):
        problems.append("disabling gradient_accumulation_fusion needs TE >= 2.7")
    return problems


class DelayWgradGraphPrerequisitesMissing(Rule):
    """## What it does
    Flags a Megatron-LM launch with `--delay-wgrad-compute` whose weight-gradient path is not graph
    safe: transformer_impl not TE, `--overlap-grad-reduce` with TE < 2.8, or wgrad inside the graph
    (`attn`, or a non-overlapped shared expert under `moe_router`) with TE < 2.12, without gradient
    accumulation fusion, or with attention bias.

    ## Why is this bad?
    Megatron-LM asserts each case (`arguments.py:1822-1848`, A11): unfused gradient accumulation does
    not use static addresses, which breaks replay.

    ## Example
    ```
    pretrain_gpt.py --delay-wgrad-compute --overlap-grad-reduce --cuda-graph-impl transformer_engine \\
        --cuda-graph-modules attn --no-gradient-accumulation-fusion
    ```

    ## Use instead
    ```
    pretrain_gpt.py --delay-wgrad-compute --overlap-grad-reduce --cuda-graph-impl transformer_engine \\
        --cuda-graph-modules attn --disable-bias-linear
    ```

    ## Fix
    Upgrade TE, keep gradient accumulation fusion, drop attention bias, or move attn out of the graph.
    """

    machine_facts = ("te_version",)
    machine_question = "which Transformer Engine is installed there?"
    code = "GD215"
    name = "delay-wgrad-graph-prerequisites-missing"
    severity = Severity.ERROR
    fix = FixAvailability.NONE
    template = "--delay-wgrad-compute: {reasons}"
    fix_template = "Fix the listed settings or drop --delay-wgrad-compute"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.megatron_lm and ctx.value("delay_wgrad_compute"):
            problems = _wgrad_graph_problems(ctx)
            if problems:
                yield Hit(("args.overlap_grad_reduce", "args.gradient_accumulation_fusion",
                           *t("delay_wgrad_compute", "cuda_graph_modules", "transformer_impl")),
                          {"reasons": "; ".join(problems)})


class RouterPaddingWithoutQuantization(Rule):
    """## What it does
    Flags `moe_router_padding_for_fp8` / `moe_router_padding_for_quantization` without fp8/fp4, or
    with the allgather dispatcher.

    ## Why is this bad?
    `fp8/fp4 must be specified when moe_router_padding_for_quantization is True.` and "allgather and
    alltoall_seq dispatcher does not support moe_router_padding_for_quantization."
    (`transformer_config.py:2308-2326`). The fp8 padding is also what makes `moe_preprocess` capture
    unsafe with alltoall (GD206).

    ## Example
    ```yaml
    transformer: {num_moe_experts: 8, moe_router_padding_for_fp8: true}
    ```

    ## Use instead
    ```yaml
    transformer: {num_moe_experts: 8, moe_router_padding_for_fp8: true, fp8: e4m3, moe_token_dispatcher_type: alltoall}
    ```

    ## Fix
    Enable fp8/fp4 and a non-allgather dispatcher, or drop the padding.
    """

    code = "GD216"
    name = "router-padding-without-quantization"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "moe router padding for quantization is on but {reason}"
    fix_template = "Turn off moe_router_padding_for_fp8 or enable fp8/fp4 with the alltoall dispatcher"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        v = ctx.value
        if not (v("moe_router_padding_for_fp8") or v("moe_router_padding_for_quantization")):
            return
        names = t("moe_router_padding_for_fp8", "moe_router_padding_for_quantization")
        if v("fp8") is None and v("fp4") is None:
            yield Hit((*names, *t("fp8")), {"reason": "neither fp8 nor fp4 is set"})
        elif v("moe_token_dispatcher_type") in ("allgather", "alltoall_seq"):
            yield Hit((*names, *t("moe_token_dispatcher_type")),
                      {"reason": f"dispatcher {v('moe_token_dispatcher_type')!r} does not support it"})
