"""GD311: an FP8 or FP4 recipe the training GPU cannot run. Transformer Engine decides it at the first
autocast (`check_recipe_support` in transformer_engine/pytorch/quantization.py); graphdoctor reads the same
table from the recipe in the run and the training GPU's compute capability (`--target`, or this machine).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import t

from graphdoctor.config.fp8 import low_precision_recipe, unsupported_reason
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "environment"


def recipe_of(ctx: CheckContext) -> tuple[str, str] | None:
    """(recipe, field) of the run's low-precision recipe (graphdoctor.config.fp8.low_precision_recipe)."""
    return low_precision_recipe(ctx.value)


class LowPrecisionRecipeUnsupportedGpu(Rule):
    """## What it does
    Reports an FP8 or FP4 recipe that the training GPU cannot run: `fp8_recipe` `delayed` or `tensorwise`
    before Ada (sm_89), `blockwise` before Hopper (sm_90) or with CUDA older than 12.9, `mxfp8` outside
    Blackwell sm_100-sm_11x, `fp4_recipe: nvfp4` before Blackwell (sm_100). The GPU is the one `--target`
    names (a file from `graphdoctor env --json`, or `gpu=sm_90`), or this machine's.

    ## Why is this bad?
    Transformer Engine refuses the recipe at the first FP8 autocast
    (`check_recipe_support`: "Device compute capability 10.0 or higher required for MXFP8 execution"), after
    the job has queued, started and built its model. On an H200 (sm_90), Megatron-Bridge's MXFP8 and NVFP4
    recipes cannot run; delayed, tensorwise and blockwise can.

    ## Example
    ```yaml
    # on an H200 (sm_90)
    transformer: {fp8: e4m3, fp8_recipe: mxfp8}
    ```

    ## Use instead
    ```yaml
    transformer: {fp8: e4m3, fp8_recipe: blockwise}
    ```

    ## Fix
    Choose a recipe the GPU runs (on Hopper: delayed, tensorwise or blockwise), or train on Blackwell.

    ## Known problems
    Only checked when the training GPU is known. The table follows Transformer Engine's capability checks;
    Ada's extra cuBLASLt and CUDA 12.1 conditions are not checked. `custom` recipes are not judged.
    """

    code = "GD311"
    name = "low-precision-recipe-unsupported-gpu"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "{reason}"
    fix_template = "Choose an FP8 or FP4 recipe the training GPU runs, or train on a GPU that runs {recipe}"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        found = recipe_of(ctx)
        capability = ctx.facts.gpu_capability
        if found is None or capability is None:
            return
        recipe, name = found
        reason = unsupported_reason(recipe, capability, ctx.facts.cuda_version)
        if reason is not None:
            given = name if name in ctx.transformer else ("fp4" if name == "fp4_recipe" else "fp8")
            yield Hit(t(given), {"reason": reason, "recipe": recipe})
