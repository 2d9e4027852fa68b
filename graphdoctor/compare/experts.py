"""MoE experts compared one by one: for every expert of every MoE layer on every rank, the first step at which its
main_grads and its parameters leave eager's, from the steps' per-tensor fingerprints.

With expert parallelism each rank holds a shard of every MoE layer's experts; a folded multi-GPU record names
each rank's tensors `rank<r>:...` and its shards `rank<r>:<layer>` (graphdoctor.parent.ranks), so an expert is
named by its global number, the rank that holds it and its local index there, as Megatron placed it
(graphdoctor.protocol.experts). One layer of the model is one Megatron layer_number: pipeline stages restart their
module names at `decoder.layers.0`, and data-parallel ranks hold copies of the same experts, which the grid of
experts (ExpertsDiff.grid) shows as one cell. Pure Python on RunRecords.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from graphdoctor.compare.prints import FAMILIES
from graphdoctor.protocol.experts import ExpertRef, ExpertShard, expert_of
from graphdoctor.protocol.lanes import BitprintError, differing_tensors, pairs
from graphdoctor.protocol.record import RunRecord, split_rank
from graphdoctor.strict_json import nullable

FAMILY_WORDS = {"grads": "main_grads", "params": "parameters"}


def _order(first: tuple[int, str]) -> tuple[int, int]:
    """A (step, family) difference's place: by step, main_grads before parameters within one."""
    return first[0], FAMILIES.index(first[1])


@dataclass(frozen=True, slots=True)
class ExpertRow:
    """One expert of one MoE layer on one rank, against the same expert in eager."""

    layer: str
    """The MoE layer's module (`decoder.layers.0.mlp`), without the rank."""
    rank: int | None
    """The rank that holds the expert (None: a one-process run)."""
    expert: int | None
    """Its global number (None: tensors of the layer's experts that no single expert owns)."""
    local: int | None
    """Its index among the rank's local experts."""
    tensors: int
    """Its fingerprinted tensors."""
    layer_number: int | None = None
    """Megatron's layer_number of the layer (1-based over every pipeline stage); None where unknown."""
    grads_step: int | None = None
    """First step whose main_grads of the expert differ (None: equal at every compared step)."""
    params_step: int | None = None
    """First step whose parameters of the expert differ."""

    @property
    def first(self) -> tuple[int, str] | None:
        """(step, family) of the expert's first difference; main_grads before parameters within a step."""
        found = [(step, family) for family, step in (("grads", self.grads_step), ("params", self.params_step))
                 if step is not None]
        return min(found, key=_order) if found else None

    @property
    def label(self) -> str:
        """`decoder.layers.0.mlp expert 2 on rank 1 (its local expert 0)`."""
        who = "the experts' shared tensors" if self.expert is None else f"expert {self.expert}"
        where = "" if self.rank is None else f" on rank {self.rank}"
        local = "" if self.rank is None or self.local is None else f" (its local expert {self.local})"
        return f"{self.layer} {who}{where}{local}"

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"layer": self.layer, "layer_number": self.layer_number, "rank": self.rank, "expert": self.expert,
                "local": self.local, "tensors": self.tensors, "grads_step": self.grads_step,
                "params_step": self.params_step}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExpertRow:
        """Inverse of to_dict."""
        ints = {key: nullable(int, data.get(key))
                for key in ("rank", "expert", "local", "layer_number", "grads_step", "params_step")}
        return cls(layer=str(data["layer"]), tensors=int(data["tensors"]), **ints)

    @property
    def layer_key(self) -> int | str:
        """The model layer the row belongs to, whichever rank holds it: its layer_number, else its module name."""
        return self.layer if self.layer_number is None else self.layer_number


@dataclass(frozen=True, slots=True)
class ExpertsDiff:
    """Every expert of a graphed MoE run against eager."""

    steps: int
    """Steps compared (both runs fingerprinted them)."""
    rows: tuple[ExpertRow, ...]
    """One per (layer, rank, expert), in the records' tensor order."""

    @property
    def differing(self) -> tuple[ExpertRow, ...]:
        """The experts that differ at some step, first difference first."""
        found = [(first, row) for row in self.rows if (first := row.first) is not None]
        return tuple(row for _, row in sorted(found, key=lambda pair: _order(pair[0])))

    def grid(self) -> tuple[tuple[str, ...], tuple[int, ...], dict[tuple[str, int], tuple[ExpertRow, ...]]]:
        """(row labels, global expert numbers, the rows of each (label, expert) cell): one row per model layer and
        a cell per expert holding every rank's copy of it. A label is the layer's module name, with its ranks
        where pipeline stages share that name."""
        keys = list(dict.fromkeys(r.layer_key for r in self.rows))
        names: dict[int | str, str] = {}
        for row in self.rows:
            names.setdefault(row.layer_key, row.layer)
        shared = {name for name, count in Counter(names.values()).items() if count > 1}
        labels: dict[int | str, str] = {}
        for key in keys:
            ranks = sorted({r.rank for r in self.rows if r.layer_key == key and r.rank is not None})
            labels[key] = names[key] + (f" on rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"
                                        if names[key] in shared and ranks else "")
        cells: dict[tuple[str, int], list[ExpertRow]] = {}
        for row in self.rows:
            if row.expert is not None:
                cells.setdefault((labels[row.layer_key], row.expert), []).append(row)
        experts = tuple(sorted({r.expert for r in self.rows if r.expert is not None}))
        return tuple(labels[k] for k in keys), experts, {k: tuple(v) for k, v in cells.items()}

    def _shape(self) -> str:
        layers = len({r.layer_key for r in self.rows})
        experts = len({r.expert for r in self.rows if r.expert is not None})
        ranks = len({r.rank for r in self.rows if r.rank is not None})
        return (f"{layers} layer{'s' * (layers != 1)} x {experts} experts"
                + (f" on {ranks} ranks" if ranks > 1 else ""))

    def line(self) -> str:
        """`experts: 2 layers x 4 experts on 2 ranks, equal at 8 steps` or the first that differs."""
        differing = self.differing
        if not differing:
            return f"experts: {self._shape()}, every expert's main_grads and parameters equal at {self.steps} steps"
        first = differing[0]
        step, family = first.first  # type: ignore[misc]
        return (f"experts: {len(differing)} of {len(self.rows)} differ ({self._shape()}); first {first.label}: "
                f"{FAMILY_WORDS[family]} at step {step}")

    def to_dict(self) -> dict[str, Any]:
        """JSON view (docs/moe.md, `impls[].experts`)."""
        return {"steps": self.steps, "rows": [r.to_dict() for r in self.rows],
                "differing": len(self.differing)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExpertsDiff:
        """Inverse of to_dict."""
        return cls(steps=int(data["steps"]), rows=tuple(ExpertRow.from_dict(r) for r in data.get("rows") or ()))


def _expert_tensors(names: tuple[str, ...], shards: tuple[ExpertShard, ...]) -> dict[ExpertRef, list[int]]:
    """Tensor indices of each expert (and of each shard's tensors no single expert owns), in tensor order."""
    found: dict[ExpertRef, list[int]] = {}
    for index, name in enumerate(names):
        ref = expert_of(name, shards)
        if ref is not None:
            found.setdefault(ref, []).append(index)
    return found


def compare_experts(reference: RunRecord, graphed: RunRecord) -> ExpertsDiff | None:
    """The expert-by-expert comparison of two runs; None without MoE experts or fingerprints to compare."""
    shards = graphed.experts or reference.experts
    names = graphed.tensor_names or reference.tensor_names
    groups = _expert_tensors(names, shards)
    if not groups:
        return None
    first: dict[ExpertRef, dict[str, int]] = {owner: {} for owner in groups}
    by_step = {s.step: s for s in reference.steps}
    compared = 0
    for rec in graphed.steps:
        ref = by_step.get(rec.step)
        if ref is None or ref.prints is None or rec.prints is None:
            continue
        compared += 1
        for family in FAMILIES:
            try:
                unequal = set(differing_tensors(pairs(getattr(ref.prints, family)),
                                                pairs(getattr(rec.prints, family))))
            except BitprintError:
                return None  # not the same model: find_divergence says so
            for owner, indices in groups.items():
                if family not in first[owner] and unequal.intersection(indices):
                    first[owner][family] = rec.step
    if not compared:
        return None
    rows = []
    for owner, indices in groups.items():
        rank, bare = split_rank(owner.shard.layer)
        rows.append(ExpertRow(layer=bare, rank=rank, expert=owner.expert, local=owner.local, tensors=len(indices),
                              layer_number=owner.shard.layer_number, grads_step=first[owner].get("grads"),
                              params_step=first[owner].get("params")))
    return ExpertsDiff(steps=compared, rows=tuple(rows))


__all__ = ["ExpertRow", "ExpertsDiff", "compare_experts"]
