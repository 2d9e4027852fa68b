"""`diff --plan` and `advise --plan`, decided without a GPU: the model and its facts, its skeleton built on the meta
device, every screening of the implementations (`diff_plan`) or candidates (`plan`), and every refusal at once
(what this installation cannot build, then what the model's own build says). graphdoctor.report.plan renders it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from graphdoctor.advise.candidates import Screening
from graphdoctor.advise.run import diff_plan, plan
from graphdoctor.config import DiffConfig
from graphdoctor.config.description import model_facts
from graphdoctor.parent.availability import why_unavailable
from graphdoctor.parent.skeleton import Skeleton, build_skeleton
from graphdoctor.parent.static import cannot_build

PlanOf = Literal["diff", "advise"]


@dataclass(frozen=True, slots=True)
class Plan:
    """One plan: the run as diff (or advise) reads it, and what it refuses."""

    of: PlanOf
    config: DiffConfig
    screenings: list[Screening]
    facts: dict[str, Any]
    skeleton: Skeleton
    refusals: list[str]

    def skeleton_dict(self) -> dict[str, Any]:
        """The plan document's `skeleton`: what building the model on the meta device said."""
        return {"num_parameters": self.skeleton.num_parameters, "error": self.skeleton.error,
                "where": self.skeleton.where, "not_built": self.skeleton.not_built}


def make_plan(of: PlanOf, config: DiffConfig) -> Plan:
    """The plan of `diff` or `advise` for `config`. diff's plan refuses what diff refuses before any GPU work
    (parent.static.refuse_before_gpu_work), the GPU itself aside."""
    cannot = why_unavailable("local", config)  # what this machine cannot build at all (TE layers without TE, ...)
    skeleton = build_skeleton(config) if cannot is None else Skeleton(not_built=cannot)
    facts = model_facts(config.model)
    refusals = cannot_build(config)
    if skeleton.error is not None:
        if "zero_centered_gamma" in skeleton.error:  # Megatron's own words for what missing_apex_norm predicts
            refusals = [why for why in refusals if not why.startswith("layernorm_zero_centered_gamma")]
        refusals.append(f"every child's set-up would fail building the model: {skeleton.error}"
                        + (f" ({skeleton.where})" if skeleton.where else ""))
    screenings = diff_plan(config) if of == "diff" else plan(config)
    return Plan(of=of, config=config, screenings=screenings, facts=facts, skeleton=skeleton, refusals=refusals)


__all__ = ["Plan", "PlanOf", "make_plan"]
