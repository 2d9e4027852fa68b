"""GD3xx environment rules, part 2: what the training machine's installation allows the placement (NVIDIA
Apex for sequence parallel with megatron-core's local layer spec; EnvironmentFacts from --target).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import t

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
