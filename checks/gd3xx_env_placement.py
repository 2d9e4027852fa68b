"""GD3xx environment rules, part 2: what the training machine's installation allows the placement (NVIDIA
Apex for sequence parallel with megatron-core's local layer spec) and the recompute settings (Transformer
Engine for CheckpointWithoutOutput recomputes in megatron-core 0.19.2); EnvironmentFacts from --target.
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import selective_recompute, t

from graphdoctor.config.placement import RECOMPUTE_NEEDING_TE
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "environment"


class SequenceParallelLocalSpecWithoutApex(Rule):
    """## What it does
    Flags `sequence_parallel` with megatron-core's local layer spec (`transformer_impl: local`, Megatron-LM's
    `--transformer-impl local`, or graphdoctor's `layer_spec: local`) when Apex is not installed on the
    training machine.

    ## Why is this bad?
    The local GPT spec picks its norm at import: Apex's `FusedLayerNorm` when `import apex` works, else
    `WrappedTorchNorm` (megatron-core 0.19.2 `gpt_layer_specs.py:62-76`), which asserts
    `sequence parallel not supported by torch LayerNorm` when the first layer is built
    (`transformer/torch_norm.py:50`). The model never builds, eager or graphed; measured on two H200s
    with tensor parallel 2.

    ## Example
    ```yaml
    # facts: apex_installed=false
    transformer: {transformer_impl: local, tensor_model_parallel_size: 2, sequence_parallel: true}
    ```

    ## Use instead
    ```yaml
    # facts: apex_installed=false
    transformer: {transformer_impl: transformer_engine, tensor_model_parallel_size: 2, sequence_parallel: true}
    ```

    ## Fix
    Use Transformer Engine's layer spec (`--transformer-impl transformer_engine`; `graphdoctor diff
    --layer-spec te`), or install NVIDIA Apex on the training machine.

    ## Known problems
    Judges the training machine that `check --target` describes (without one, "not checked"); Apex is
    looked up by name (`importlib.util.find_spec('apex')`), never imported. A run file without
    `transformer_impl` or `layer_spec` is not flagged (Megatron's default implementation is Transformer
    Engine); `graphdoctor diff` refuses the combination itself before any GPU work.
    """

    code = "GD308"
    name = "sequence-parallel-local-spec-without-apex"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    machine_facts = ("apex_installed",)
    machine_question = "is NVIDIA Apex installed there?"
    template = "sequence_parallel with the local layer spec ({which}) and no Apex: torch LayerNorm refuses it"
    fix_template = "Use the Transformer Engine layer spec or install Apex"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if not ctx.value("sequence_parallel") or ctx.facts.apex_installed:
            return
        if ctx.run.get("layer_spec") == "local":
            yield Hit(("transformer.sequence_parallel", "run.layer_spec"), {"which": "layer_spec: local"})
        elif "transformer_impl" in ctx.transformer and ctx.value("transformer_impl") == "local":
            yield Hit(t("sequence_parallel", "transformer_impl"), {"which": "transformer_impl: local"})


class RecomputeWithoutTransformerEngine(Rule):
    """## What it does
    Flags selective recompute of `layernorm`, `moe_act` or `gdn_norm_out` when Transformer Engine is not
    installed on the training machine.

    ## Why is this bad?
    megatron-core 0.19.2 recomputes those modules through `CheckpointWithoutOutput()`, built with its
    default `fp8=False` (`transformer_layer.py:633` and `:766`, `moe/experts.py:883`,
    `ssm/gated_delta_net/gdn.py:256`). Its constructor sets `self.fp8 = fp8 is not None`, which is True
    (`tensor_parallel/random.py:740`), so the first forward calls `FP8GlobalStateManager`
    (`random.py:693`), a name imported only when Transformer Engine is (`random.py:87`): `NameError: name
    'FP8GlobalStateManager' is not defined`, eager or graphed. Measured on the H200 with
    `recompute_modules: [layernorm]` and no Transformer Engine.

    ## Example
    ```yaml
    # facts: te_version=null
    transformer: {recompute_granularity: selective, recompute_modules: [layernorm]}
    ```

    ## Use instead
    ```yaml
    # facts: te_version=null
    transformer: {recompute_granularity: selective, recompute_modules: [core_attn]}
    ```

    ## Fix
    Install Transformer Engine on the training machine, or recompute other modules (`core_attn`, `mlp`).

    ## Known problems
    Judges the training machine that `check --target` describes (without one, "not checked");
    `graphdoctor diff` refuses the combination itself before any GPU work. Code that builds
    `CheckpointWithoutOutput(fp8=config.fp8)` itself is not affected and not flagged.
    """

    code = "GD309"
    name = "recompute-without-transformer-engine"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    machine_facts = ("te_version",)
    machine_question = "is Transformer Engine installed there?"
    template = ("selective recompute of {modules} without Transformer Engine: megatron-core 0.19.2's "
                "CheckpointWithoutOutput() raises NameError FP8GlobalStateManager at the first forward")
    fix_template = "Install Transformer Engine or recompute other modules (core_attn, mlp)"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        selective = selective_recompute(ctx)
        if ctx.facts.te_version is not None or selective is None:
            return
        modules, keys = selective
        needing = [m for m in modules if m in RECOMPUTE_NEEDING_TE]
        if needing:
            yield Hit(tuple(dict.fromkeys(keys)), {"modules": ", ".join(needing)})
