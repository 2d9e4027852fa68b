"""Module and parameter names as the reports give them: without the wrappers Megatron puts around a model."""

from __future__ import annotations

from typing import Any

from graphdoctor.protocol.experts import ExpertShard


def strip_wrappers(name: str) -> str:
    """A module or parameter name without the DDP/Float16Module `module.` prefixes ("" for them)."""
    while name.startswith("module."):
        name = name[len("module."):]
    return "" if name == "module" else name


def expert_shards(model: Any) -> tuple[ExpertShard, ...]:
    """Every MoE layer's experts on this rank as Megatron placed them (MoELayer.local_expert_indices, the global
    numbers of the rank's local experts), named without wrappers; () for a model without MoE layers."""
    found = []
    for name, module in model.named_modules():
        indices = getattr(module, "local_expert_indices", None)
        if indices is None or not hasattr(module, "experts"):
            continue
        total = getattr(getattr(module, "config", None), "num_moe_experts", None) or len(indices)
        number = getattr(module, "layer_number", None)
        found.append(ExpertShard(layer=strip_wrappers(name), experts=tuple(int(i) for i in indices),
                                 num_experts=int(total), layer_number=number if isinstance(number, int) else None))
    return tuple(found)


__all__ = ["expert_shards", "strip_wrappers"]
