"""FP8 and FP4 training as graphdoctor reads it from a run: the formats and recipes Megatron takes, which GPU each
recipe needs (Transformer Engine's own capability checks), and the TransformerConfig fields of `--fp8-format`,
`--fp8-recipe` and `--fp8-param-gather` for graphdoctor's own model.

graphdoctor decides one thing of its own here: where each child initialises its weights (`initialisation`).
Megatron decides everything else: `get_fp8_recipe` builds the recipe from the TransformerConfig, the transformer
block enters `fp8_autocast`, and the model is built under `fp8_model_init` for FP8 primary weights
(megatron/core/fp8_utils.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FP8_FORMATS: tuple[str, ...] = ("e4m3", "hybrid")
"""Megatron-LM's --fp8-format choices (TransformerConfig.fp8)."""

FP8_RECIPES: tuple[str, ...] = ("delayed", "tensorwise", "blockwise", "mxfp8")
"""Megatron's Fp8Recipe values graphdoctor takes as --fp8-recipe (`custom` needs the user's quantizer factory)."""

RECIPE_NEEDS: dict[str, tuple[tuple[int, int], tuple[int, int] | None, str]] = {
    "delayed": ((8, 9), None, "Ada (sm_89) or newer"),
    "tensorwise": ((8, 9), None, "Ada (sm_89) or newer"),
    "blockwise": ((9, 0), None, "Hopper (sm_90) or newer, with CUDA 12.9 or newer"),
    "mxfp8": ((10, 0), (12, 0), "Blackwell sm_100 to sm_11x (not sm_120 yet)"),
    "nvfp4": ((10, 0), None, "Blackwell (sm_100) or newer"),
}
"""Recipe -> (lowest compute capability, first capability that no longer runs it, in words): Transformer
Engine's `_compute_fp8_support`, `_compute_fp8_block_scaling_support`, `_compute_mxfp8_support` and
`_compute_nvfp4_support` (transformer_engine/pytorch/quantization.py, TE 2.20). `custom` recipes are the user's own
and are not judged."""

BLOCKWISE_CUDA = (12, 9)
"""CUDA version (torch.version.cuda) blockwise FP8 GEMMs need."""


SAME_WEIGHTS: dict[str, Any] = {"use_cpu_initialization": True}
"""graphdoctor's own setting for every child: weights initialised on the CPU from the seed, so that eager and
every graphed child start from the same weights whatever RNG tracker their graphs need."""

FP8_WEIGHTS_ON_GPU: dict[str, Any] = {"use_cpu_initialization": False}
"""The same setting for FP8 primary weights (`fp8_param`): Megatron's CPU initialisation quantizes a CPU tensor into
a CUDA FP8 weight, an illegal memory access on the H200 (TE 2.20.2, float8_tensor.py update_quantized), so they are
initialised on the GPU, from the same seed in every child (Megatron-LM's --use-cpu-initialization cannot say False:
it is kept as an override of the line)."""


def initialisation(fp8_weights: bool) -> dict[str, Any]:
    """Where every child initialises its weights: SAME_WEIGHTS, or FP8_WEIGHTS_ON_GPU for FP8 primary weights."""
    return dict(FP8_WEIGHTS_ON_GPU if fp8_weights else SAME_WEIGHTS)


def low_precision_recipe(value: Callable[[str], Any]) -> tuple[str, str] | None:
    """(recipe, field) of a run's low-precision recipe, from its TransformerConfig values: `fp4_recipe` when fp4 is
    on, else `fp8_recipe` when fp8 is on (Megatron's default `delayed`); None when neither is or the recipe is the
    user's own (`custom`)."""
    if value("fp4"):
        recipe, name = value("fp4_recipe") or "nvfp4", "fp4_recipe"
    elif value("fp8"):
        recipe, name = value("fp8_recipe") or "delayed", "fp8_recipe"
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


def recipe_unavailable_here(value: Callable[[str], Any]) -> str | None:
    """Why this machine's GPU cannot run the run's recipe (one line), None when it can, when the run trains in
    neither FP8 nor FP4, or when no GPU is visible (the plan says which GPU each recipe needs instead)."""
    found = low_precision_recipe(value)
    if found is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    capability = torch.cuda.get_device_capability()
    reason = unsupported_reason(found[0], (int(capability[0]), int(capability[1])), torch.version.cuda)
    return None if reason is None else f"{reason} ({torch.cuda.get_device_name()}); Transformer Engine refuses " \
                                       "the recipe at the first FP8 autocast"


def recipe_needs(value: Callable[[str], Any]) -> str | None:
    """`fp8 hybrid delayed: needs Ada (sm_89) or newer`, the plan's line for a run with a recipe; None without."""
    found = low_precision_recipe(value)
    if found is None:
        return None
    recipe = found[0]
    fmt = value("fp4") if found[1] == "fp4_recipe" else value("fp8")
    kind = "fp4" if found[1] == "fp4_recipe" else "fp8"
    return f"{kind} {fmt} {recipe} needs {RECIPE_NEEDS[recipe][2]} (checked against the GPU when diff runs)"


def fp8_fields(fp8_format: str | None, fp8_recipe: str | None, fp8_param_gather: bool) -> dict[str, Any]:
    """TransformerConfig fields of graphdoctor's FP8 flags (encoded), for its own model: `fp8`, `fp8_recipe`
    (Megatron's Fp8Recipe) and `fp8_param` (FP8 primary weights, Megatron-LM's --fp8-param-gather)."""
    from graphdoctor.config.codec import encode

    out: dict[str, Any] = {}
    if fp8_format is not None:
        out["fp8"] = fp8_format
    if fp8_recipe is not None:
        from megatron.core.enums import Fp8Recipe

        out["fp8_recipe"] = encode(Fp8Recipe(fp8_recipe))
    if fp8_param_gather:
        out["fp8_param"] = True
    return out


__all__ = ["BLOCKWISE_CUDA", "FP8_FORMATS", "FP8_RECIPES", "FP8_WEIGHTS_ON_GPU", "RECIPE_NEEDS", "SAME_WEIGHTS",
           "fp8_fields", "initialisation", "low_precision_recipe",
           "recipe_needs", "recipe_unavailable_here", "unsupported_reason"]
