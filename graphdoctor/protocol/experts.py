"""Which MoE experts a rank holds, as Megatron placed them, and which of the rank's parameters belong to which
expert.

Megatron's MoELayer keeps `local_expert_indices`: the global expert numbers of the experts this rank holds
(ep_rank x num_local_experts + local index). A child reads them from every MoE layer of its model and sends them
with its tensor names (events.Tensors), so the parent can name the expert a fingerprinted tensor belongs to: with
expert parallelism rank 1's `local_experts.0` is global expert 2 of 4, not expert 0.

Expert parameters are named as megatron-core 0.19's expert modules name them:
- SequentialMLP: `<layer>.experts.local_experts.<local>.<linear>.weight`;
- TEGroupedMLP: `<layer>.experts.<linear>.weight<local>` (and `bias<local>`).
Any other tensor under `<layer>.experts.` stands for the rank's whole shard of the layer (`local` None). Shared
experts (`<layer>.shared_experts.`) and the router belong to no expert.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from graphdoctor.strict_json import nullable

_SEQUENTIAL = re.compile(r"local_experts\.(\d+)\.")
_GROUPED = re.compile(r"[^.]+\.(?:weight|bias)(\d+)$")


@dataclass(frozen=True, slots=True)
class ExpertShard:
    """The experts one MoE layer holds on one rank."""

    layer: str
    """The MoE layer's module name (`decoder.layers.1.mlp`; `rank1:decoder.layers.1.mlp` in a folded record)."""
    experts: tuple[int, ...]
    """Global numbers of the rank's local experts, in local order (Megatron's local_expert_indices)."""
    num_experts: int
    """Experts of the layer over every expert-parallel rank."""
    layer_number: int | None = None
    """Megatron's layer_number of the layer (1-based, counted over every pipeline stage: module names restart at
    `decoder.layers.0` on each stage); None where the layer has none."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"layer": self.layer, "experts": list(self.experts), "num_experts": self.num_experts,
                "layer_number": self.layer_number}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExpertShard:
        """Inverse of to_dict."""
        return cls(layer=str(data["layer"]), experts=tuple(int(e) for e in data["experts"]),
                   num_experts=int(data["num_experts"]), layer_number=nullable(int, data.get("layer_number")))


@dataclass(frozen=True, slots=True)
class ExpertRef:
    """The expert a parameter belongs to."""

    shard: ExpertShard
    local: int | None
    """Its local index on the rank; None for a tensor of the experts module that no single expert owns."""

    @property
    def expert(self) -> int | None:
        """Its global number; None for a whole-shard tensor."""
        return None if self.local is None else self.shard.experts[self.local]


def expert_of(name: str, shards: tuple[ExpertShard, ...]) -> ExpertRef | None:
    """The expert parameter `name` belongs to; None for a parameter of no expert (attention, router, shared
    experts, a dense layer) or a local index the shard does not have."""
    for shard in shards:
        head = shard.layer + ".experts."
        if not name.startswith(head):
            continue
        rest = name[len(head):]
        found = _SEQUENTIAL.match(rest) or _GROUPED.match(rest)
        if found is None:
            return ExpertRef(shard, None)
        local = int(found.group(1))
        return ExpertRef(shard, local) if local < len(shard.experts) else None
    return None


__all__ = ["ExpertRef", "ExpertShard", "expert_of"]
