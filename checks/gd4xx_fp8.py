"""GD406-GD407: FP8 and FP4 runs that Megatron and Transformer Engine accept but that public threads show going wrong
under CUDA graphs: FP8 primary weights loaded from a checkpoint into graphed layers (NVIDIA/Megatron-LM#6036), and
NVFP4 Transformer Engine graphs replayed for training after an evaluation (NVIDIA/TransformerEngine#3316).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import t

from graphdoctor.config.impl import MEGATRON_EAGER, Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "hazards"

FP8_WEIGHTS_LOAD_TE = "2.18.0"
"""The first Transformer Engine release with TE PR#3123 ("Avoid unpickling the extra state when not needed"), the
commit NVIDIA/Megatron-LM#6036's bisection named first bad."""


def _checkpoint_load(ctx: CheckContext) -> tuple[tuple[str, ...], str] | None:
    """(fields, path) of the checkpoint the run loads: a launch line's `--load`, a Megatron-Bridge config's
    `checkpoint.load` or `checkpoint.pretrained_checkpoint`; None when it loads none (or the input cannot say)."""
    if ctx.megatron_lm:
        load = ctx.arg("load")
        return (("args.load",), str(load)) if load else None
    if ctx.bridge is not None:
        for key in ("load", "pretrained_checkpoint"):
            value = ctx.bridge.checkpoint.get(key)
            if value:
                return ((f"checkpoint.{key}",), str(value))
    return None


class Fp8WeightsLoadedUnderGraphs(Rule):
    """## What it does
    Flags FP8 primary weights (`fp8_param`, Megatron-LM's `--fp8-param-gather`) loaded from a checkpoint (`--load`;
    Megatron-Bridge's `checkpoint.load` or `pretrained_checkpoint`) into a model that runs CUDA graphs, with
    Transformer Engine 2.18 or newer on the training machine.

    ## Why is this bad?
    In NVIDIA/Megatron-LM#6036, Megatron-LM's own graphed FP8 inference tests emitted one token over and over once
    their checkpoint was loaded into FP8 primary-weight storage; the bisection named Transformer Engine PR#3123
    (TE 2.18) first bad, and Megatron-LM PR#6038 dropped `--fp8-param-gather` from those tests. The graphs read the
    FP8 weights and their scale inverses in place, so what the load leaves there is what every replay computes
    with, and nothing fails: the outputs are wrong.

    ## Example
    ```
    pretrain_gpt.py --cuda-graph-impl transformer_engine --fp8-format hybrid --fp8-param-gather \\
        --use-distributed-optimizer --load checkpoints/llama3_8b_fp8
    ```

    ## Use instead
    ```
    pretrain_gpt.py --cuda-graph-impl transformer_engine --fp8-format hybrid \\
        --use-distributed-optimizer --load checkpoints/llama3_8b_fp8
    ```

    ## Fix
    Before the run, compare eager and graphed across a save and a load on the same line:
    `graphdoctor diff --megatron-args @LINE --save-at S --resume` loads its own checkpoint into FP8 primary weights
    in a fresh process and compares every step after it, FP8 state included. Where it differs, or where the
    checkpoint holds BF16 primary weights, keep BF16 primary weights (drop `--fp8-param-gather`), as Megatron-LM
    PR#6038 did.

    ## Known problems
    Only checked when the training machine's Transformer Engine is known (`--target`). Run files name no
    checkpoint, so only launch lines and Megatron-Bridge configs are judged. On the H200 with TE 2.20.2,
    `graphdoctor diff --save-at 4 --resume` of Megatron-LM's Llama-3 8B FP8 example line (shrunk) is what
    docs/fp8.md reports.
    """

    code = "GD406"
    name = "fp8-weights-loaded-under-graphs"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    machine_facts = ("te_version",)
    machine_question = "which Transformer Engine is installed there?"
    template = ("FP8 primary weights loaded from {load} into CUDA graphs ({impl}) with Transformer Engine {te}: "
                "Megatron-LM#6036 saw graphed output garbage after such a load")
    fix_template = ("Compare eager and graphed across a load (graphdoctor diff --save-at S --resume), or load into "
                    "BF16 primary weights (drop --fp8-param-gather)")

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        te = ctx.facts.te_version
        if "te_version" in ctx.facts.unknown or te is None:  # an unknown machine is "not checked" (rules.engine)
            return
        if ctx.graph.impl == MEGATRON_EAGER or not ctx.value("fp8") or not ctx.value("fp8_param"):
            return
        loaded = _checkpoint_load(ctx)
        if loaded is None or not ctx.facts.te_at_least(FP8_WEIGHTS_LOAD_TE):
            return
        fields, path = loaded
        yield Hit((*fields, *t("fp8_param", "cuda_graph_impl")), {"load": path, "impl": ctx.graph.impl, "te": te})


def _evaluates(ctx: CheckContext) -> tuple[str, ...] | None:
    """The fields that turn on evaluation between training steps; None when the run does not evaluate."""
    if ctx.megatron_lm:
        if ctx.arg("eval_iters") and not ctx.arg("skip_train") and ctx.arg("eval_interval") != 0:
            return ("args.eval_iters",)
        return None
    if ctx.run.get("eval_interval") and ctx.run.get("eval_iters", 1):
        return ("run.eval_interval",)
    return None


class Nvfp4TeGraphsAcrossEvaluation(Rule):
    """## What it does
    Flags NVFP4 training (`fp4` with `fp4_recipe: nvfp4`) whose Transformer Engine graphs capture Mamba layers
    (`cuda_graph_modules` naming `mamba`, or whole-layer graphs of a hybrid model) while the run evaluates between
    training steps.

    ## Why is this bad?
    NVIDIA/TransformerEngine#3316: Nemotron-3-Super on GB200 hits an illegal memory access or a segfault in the
    first graphed training backward after a validation pass, with NVFP4 and the `mamba` scope. MXFP8, or `mamba`
    left out of the scope, trains on. The thread is open; the job dies at the first evaluation, after hours of
    training.

    ## Example
    ```
    pretrain_mamba.py --hybrid-layer-pattern M*M*M*M* --fp4-format e2m1 --fp4-recipe nvfp4 \\
        --cuda-graph-impl transformer_engine --cuda-graph-modules attn mamba --eval-iters 10
    ```

    ## Use instead
    ```
    pretrain_mamba.py --hybrid-layer-pattern M*M*M*M* --fp4-format e2m1 --fp4-recipe nvfp4 \\
        --cuda-graph-impl transformer_engine --cuda-graph-modules attn --eval-iters 10
    ```

    ## Fix
    Leave `mamba` out of the graphed modules, train in MXFP8, or evaluate outside the training job, until the thread
    is resolved. `graphdoctor diff --eval-interval K` runs the train, evaluate, train schedule on the GPU, on
    Blackwell (NVFP4 needs sm_100).

    ## Known problems
    The thread names the `mamba` scope; whether other scopes of NVFP4 TE graphs fail after an evaluation is not
    known, and they are not flagged.
    """

    code = "GD407"
    name = "nvfp4-te-graphs-across-evaluation"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = ("NVFP4 Transformer Engine graphs of Mamba layers ({modules}) with evaluation between training "
                "steps: TransformerEngine#3316 crashes in the first training backward after an evaluation")
    fix_template = "Leave mamba out of cuda_graph_modules, train in MXFP8, or evaluate outside the training job"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.impl != Impl.TRANSFORMER_ENGINE or not ctx.value("fp4") or not ctx.training_graphs:
            return
        if str(getattr(ctx.value("fp4_recipe"), "value", ctx.value("fp4_recipe")) or "nvfp4") != "nvfp4":
            return
        modules = list(ctx.graph.modules)
        if "mamba" in modules:
            graphed = ",".join(modules)
        elif not modules and (ctx.value("is_hybrid_model") or ctx.arg("hybrid_layer_pattern")):
            graphed = "whole hybrid layers"
        else:
            return
        evaluation = _evaluates(ctx)
        if evaluation is not None:
            yield Hit((*evaluation, *t("fp4", "cuda_graph_modules")), {"modules": graphed})
