"""GD311: an FP8 or FP4 recipe the training GPU cannot run. Transformer Engine decides it at the first
autocast (`check_recipe_support` in transformer_engine/pytorch/quantization.py); graphdoctor reads the same
table from the recipe in the run and the training GPU's compute capability (`--target`, or this machine).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import t

from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "environment"

RECIPE_NEEDS: dict[str, tuple[tuple[int, int], tuple[int, int] | None, str]] = {
    "delayed": ((8, 9), None, "Ada (sm_89) or newer"),
    "tensorwise": ((8, 9), None, "Ada (sm_89) or newer"),
    "blockwise": ((9, 0), None, "Hopper (sm_90) or newer, with CUDA 12.9 or newer"),
    "mxfp8": ((10, 0), (12, 0), "Blackwell sm_100 to sm_11x (not sm_120 yet)"),
    "nvfp4": ((10, 0), None, "Blackwell (sm_100) or newer"),
}
"""Recipe -> (lowest compute capability, first capability that no longer runs it, in words): Transformer
Engine's `_compute_fp8_support`, `_compute_fp8_block_scaling_support`, `_compute_mxfp8_support` and
`_compute_nvfp4_support`. `custom` recipes are the user's own and are not judged."""

BLOCKWISE_CUDA = (12, 9)
"""CUDA version (torch.version.cuda) blockwise FP8 GEMMs need."""


def recipe_of(ctx: CheckContext) -> tuple[str, str] | None:
    """(recipe, field) of the run's low-precision recipe: `fp4_recipe` when fp4 is on, else `fp8_recipe` when
    fp8 is on; None when neither is (or the recipe is custom)."""
    if ctx.value("fp4"):
        recipe, name = ctx.value("fp4_recipe") or "nvfp4", "fp4_recipe"
    elif ctx.value("fp8"):
        recipe, name = ctx.value("fp8_recipe") or "delayed", "fp8_recipe"
    else:
        return None
    recipe = str(getattr(recipe, "value", recipe))
    return (recipe, name) if recipe in RECIPE_NEEDS else None


def unsupported_reason(recipe: str, capability: tuple[int, int], cuda: str | None) -> str | None:
    """Why `recipe` cannot run on a GPU of `capability` with torch built for `cuda`; None when it can."""
    low, high, words = RECIPE_NEEDS[recipe]
    sm = f"sm_{capability[0]}{capability[1]}"
    if capability < low or (high is not None and capability >= high):
        return f"{recipe} needs {words}; the training GPU is {sm}"
    if recipe == "blockwise" and cuda:
        try:
            version = tuple(int(p) for p in cuda.split(".")[:2])
        except ValueError:
            return None
        if version < BLOCKWISE_CUDA:
            return f"blockwise needs CUDA 12.9 or newer; torch is built for CUDA {cuda}"
    return None


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
