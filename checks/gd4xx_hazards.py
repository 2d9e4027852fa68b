"""GD4xx hazards: configurations megatron-core accepts but that silently change results or fail at
replay (RNG shift under local warmup, eval replaying the training graph, variable shapes).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import t

from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "hazards"


class DropoutWithLocalGraphRngShift(Rule):
    """## What it does
    Flags `hidden_dropout` or `attention_dropout` > 0 (both default to 0.1) with the local impl.

    ## Why is this bad?
    The local impl's eager warmups before capture consume RNG and, unlike TE's
    `make_graphed_callables` (TE `graph.py:1692-1724`), do not restore the generator states
    (`cuda_graphs.py:1153-1185`, `:1259-1283`). Dropout masks after capture are shifted against an
    eager run with the same seed, so graph-vs-eager diffs fail for a reason that is not a bug.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, hidden_dropout: 0.1}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local, hidden_dropout: 0.0, attention_dropout: 0.0}
    ```

    ## Fix
    Use dropout 0 when comparing with eager, or the transformer_engine impl, or let
    `graphdoctor diff --align-rng` restore the generator states around the local implementation's
    graph creation (`_CudagraphGlobalRecord.create_cudagraphs`) so dropout runs compare bitwise.
    `graphdoctor diff` reports this rule when the taps see the local implementation's draws differ
    from eager's.
    """

    code = "GD401"
    name = "dropout-with-local-graph-rng-shift"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = "hidden_dropout={hidden}, attention_dropout={attention} with cuda_graph_impl='local' (RNG shifted vs eager)"
    fix_template = "Set hidden_dropout and attention_dropout to 0.0 for graph-vs-eager comparisons"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        hidden, attention = ctx.value("hidden_dropout"), ctx.value("attention_dropout")
        if ctx.graph.impl == Impl.LOCAL and (hidden > 0 or attention > 0):
            names = [n for n, p in (("hidden_dropout", hidden), ("attention_dropout", attention)) if p > 0]
            yield Hit(t(*names), {"hidden": hidden, "attention": attention})


class EvalReplaysTrainingGraph(Rule):
    """## What it does
    Flags the local impl when evaluation runs (a Megatron-LM launch without `--eval-iters 0` /
    `--skip-train`, a Megatron-Bridge or Megatron container config whose `validation:` evaluates, or any run file
    using the local impl).

    ## Why is this bad?
    After capture an eval forward under `no_grad` picks any forward-ready runner; `is_valid` only
    checks `grad_enabled` when grad is required (`cuda_graphs.py:1883-1889`). The training graph is
    replayed: dropout active, buffers mutated. Open PR NVIDIA/Megatron-LM#6992 fixes it.

    ## Example
    ```
    pretrain_gpt.py --cuda-graph-impl local --eval-iters 10
    ```

    ## Use instead
    ```
    pretrain_gpt.py --cuda-graph-impl transformer_engine --eval-iters 10
    ```

    ## Fix
    Evaluate without graphs (delete them first) or use the transformer_engine impl, whose eval runs eager.

    ## Known problems
    Not reported for train_rl.py: its evaluation generates rollouts through the inference engine and its
    inference graphs (megatron/training/training.py, `perform_rl_step`), not through the training layers' graphs.
    """

    code = "GD402"
    name = "eval-replays-training-graph"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = "cuda_graph_impl='local' with evaluation ({how}): eval replays the training-mode graph"
    fix_template = "Run evaluation eagerly or switch to cuda_graph_impl='transformer_engine'"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.impl != Impl.LOCAL or (ctx.megatron is not None and ctx.megatron.script == "rl"):
            return
        if ctx.megatron_lm:
            iters = ctx.arg("eval_iters")
            if iters and not ctx.arg("skip_train"):
                yield Hit(("args.eval_iters", *t("cuda_graph_impl")), {"how": f"eval_iters={iters}"})
        elif ctx.bridge is not None and "eval_interval" in ctx.run:  # the config's validation: (or train:)
            if ctx.run["eval_interval"] and ctx.run.get("eval_iters"):
                yield Hit(("validation.eval_iters", *t("cuda_graph_impl")),
                          {"how": f"eval_iters={ctx.run['eval_iters']}"})
        else:
            yield Hit(t("cuda_graph_impl"), {"how": "assumed"})


def _variable(value: object) -> bool:
    return isinstance(value, list | tuple) and len(set(value)) > 1 or value == "variable"


class VariableSequenceLengthWithGraphs(Rule):
    """## What it does
    Flags CUDA graphs with a variable sequence length: `variable_seq_lengths: true`, or several
    `run.seq_length` values (a list, or `variable`).

    ## Why is this bad?
    A graph replays fixed shapes. The local impl raises "CUDA graph argument mismatch" after capture
    (`cuda_graphs.py:1630-1634`, `:1895-1901`); TE graphs use static sample args of one shape
    (`module.py:259`); full_iteration copies batches into fixed buffers (`full_cuda_graph.py:99-135`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local}
    run: {seq_length: [128, 256]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local}
    run: {seq_length: 256}
    ```

    ## Fix
    Pad every batch to one sequence length.
    """

    code = "GD403"
    name = "variable-sequence-length-with-graphs"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = "CUDA graphs ({impl}) with variable sequence length ({what})"
    fix_template = "Pad every micro-batch to one sequence length"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if not ctx.graph.enabled:
            return
        if ctx.value("variable_seq_lengths"):
            yield Hit(t("variable_seq_lengths"), {"impl": ctx.graph.impl, "what": "variable_seq_lengths=True"})
        if _variable(ctx.run.get("seq_length")):
            yield Hit(("run.seq_length",), {"impl": ctx.graph.impl, "what": f"seq_length={ctx.run['seq_length']!r}"})


class VariableMicroBatchSizeWithGraphs(Rule):
    """## What it does
    Flags CUDA graphs with a variable micro-batch geometry: several `run.micro_batch_size` values, or
    `--rampup-batch-size` (the number of micro-batches changes during ramp-up).

    ## Why is this bad?
    TE graphs are built per micro-batch from `get_num_microbatches()` at capture
    (`cuda_graphs.py:2580-2587`) and full_iteration captures `num_microbatches` reads; a later change
    replays the wrong schedule or fails the shape match.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine}
    run: {micro_batch_size: [1, 2]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine}
    run: {micro_batch_size: 2}
    ```

    ## Fix
    Keep one micro-batch size and number of micro-batches (no batch-size ramp-up) while graphed.
    """

    code = "GD404"
    name = "variable-micro-batch-size-with-graphs"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = "CUDA graphs ({impl}) with variable micro-batch geometry ({what})"
    fix_template = "Fix the micro-batch size and count while CUDA graphs are on"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if not ctx.graph.enabled:
            return
        if _variable(ctx.run.get("micro_batch_size")):
            yield Hit(("run.micro_batch_size",), {"impl": ctx.graph.impl,
                                                   "what": f"micro_batch_size={ctx.run['micro_batch_size']!r}"})
        if ctx.arg("rampup_batch_size"):
            yield Hit(("args.rampup_batch_size",), {"impl": ctx.graph.impl, "what": "rampup_batch_size"})


class FullIterationWithoutWarmup(Rule):
    """## What it does
    Flags `cuda_graph_impl: full_iteration` with `cuda_graph_warmup_steps: 0`.

    ## Why is this bad?
    FullCudaGraphWrapper captures on the call whose index equals the warmup steps
    (`full_cuda_graph.py:208`); with 0 the very first iteration is captured, before DDP buckets, NCCL
    communicators and lazily-allocated optimizer/autograd state exist, which then get created inside
    the capture (illegal during capture) or frozen in the graph.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: full_iteration, cuda_graph_warmup_steps: 0}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: full_iteration, cuda_graph_warmup_steps: 2}
    ```

    ## Fix
    Set `cuda_graph_warmup_steps` to 1 or more (Megatron's default is 3).
    """

    code = "GD405"
    name = "full-iteration-without-warmup"
    severity = Severity.WARNING
    fix = FixAvailability.ALWAYS
    template = "cuda_graph_warmup_steps={steps} with full_iteration: the first iteration is captured"
    fix_template = "Set cuda_graph_warmup_steps to at least 1"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        steps = ctx.value("cuda_graph_warmup_steps")
        if ctx.graph.impl == Impl.FULL_ITERATION and steps <= 0:
            yield Hit(t("cuda_graph_warmup_steps"), {"steps": steps})
