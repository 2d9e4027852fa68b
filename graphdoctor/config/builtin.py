"""The Megatron settings graphdoctor writes itself: each child's CUDA-graph fields, the precision fields of a dtype,
and the MoE defaults of graphdoctor's own GPT model (built by DiffConfig when no Megatron source describes one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphdoctor.config.codec import CALL, TARGET
from graphdoctor.config.impl import Impl

DTYPE_FIELDS: dict[str, dict[str, Any]] = {
    "fp32": {"params_dtype": {TARGET: "torch.float32", CALL: False}},
    "bf16": {"bf16": True, "params_dtype": {TARGET: "torch.bfloat16", CALL: False}},
    "fp16": {"fp16": True, "params_dtype": {TARGET: "torch.float16", CALL: False}},
}
"""TransformerConfig precision fields per dtype, encoded."""


def graph_fields(impl: str, modules: Sequence[str], warmup_steps: int) -> dict[str, Any]:
    """The CUDA-graph settings of one child: its implementation, the run's modules for local and
    transformer_engine (none for eager and full_iteration), the run's warm-up."""
    kind = Impl(impl)
    return {"cuda_graph_impl": kind.megatron, "cuda_graph_modules": list(modules) if kind.per_module else [],
            "cuda_graph_warmup_steps": warmup_steps, "enable_cuda_graph": False, "external_cuda_graph": False}


def moe_defaults(transformer: dict[str, Any]) -> dict[str, Any]:
    """TransformerConfig defaults an MoE run of graphdoctor's own model needs and did not set: add_bias_linear False,
    since MoELayer.forward asserts the experts return no bias (moe_layer.py:675-677 in megatron-core 0.19.2) and
    Megatron-LM's MoE recipes pass --disable-bias-linear."""
    if not transformer.get("num_moe_experts") or "add_bias_linear" in transformer:
        return {}
    return {"add_bias_linear": False}


__all__ = ["DTYPE_FIELDS", "graph_fields", "moe_defaults"]
