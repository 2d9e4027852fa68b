"""GD311's recipe table against the compute capabilities Transformer Engine checks: what an H200 (sm_90)
runs, what needs Blackwell, blockwise's CUDA floor."""

from __future__ import annotations

import pytest

from graphdoctor.config.fp8 import RECIPE_NEEDS, unsupported_reason
from graphdoctor.rules import EnvironmentFacts, check


@pytest.mark.parametrize(("recipe", "capability", "runs"), [
    ("delayed", (9, 0), True), ("tensorwise", (9, 0), True), ("blockwise", (9, 0), True),
    ("mxfp8", (9, 0), False), ("nvfp4", (9, 0), False),
    ("delayed", (8, 0), False), ("delayed", (8, 9), True), ("blockwise", (8, 9), False),
    ("mxfp8", (10, 0), True), ("mxfp8", (12, 0), False), ("nvfp4", (10, 0), True), ("nvfp4", (12, 0), True),
])
def test_recipe_table(recipe: str, capability: tuple[int, int], runs: bool) -> None:
    assert (unsupported_reason(recipe, capability, "13.0") is None) is runs


def test_blockwise_needs_cuda_12_9() -> None:
    assert unsupported_reason("blockwise", (9, 0), "12.8") == \
        "blockwise needs CUDA 12.9 or newer; torch is built for CUDA 12.8"
    assert unsupported_reason("blockwise", (9, 0), "12.9") is None


def test_every_megatron_recipe_but_custom_is_judged() -> None:
    from megatron.core.enums import Fp4Recipe, Fp8Recipe

    assert set(RECIPE_NEEDS) == {r.value for r in (*Fp8Recipe, *Fp4Recipe)} - {"custom"}


def _codes(transformer: dict[str, object], gpu: str | None) -> list[str]:
    facts = EnvironmentFacts().with_overrides({"gpu_arch": gpu, "cuda_version": "13.0"})
    return [f.code for f in check({"transformer": transformer}, facts=facts).findings if f.code == "GD311"]


def test_unknown_gpu_is_not_judged_and_fp4_defaults_to_nvfp4() -> None:
    assert _codes({"fp8": "e4m3", "fp8_recipe": "mxfp8"}, None) == []
    assert _codes({"fp4": "e2m1"}, "sm_90") == ["GD311"]
    assert _codes({"fp8": "hybrid"}, "sm_90") == []  # delayed, Megatron's default recipe
