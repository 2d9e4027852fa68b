"""Candidate graph configurations of `graphdoctor advise`, and their screening before any GPU run.

A candidate is one (implementation, cuda_graph_modules, graph_layers) triple. The candidates come from
the model (dense, or MoE when `transformer:` has num_moe_experts > 1). Each is screened by Megatron's
own validation (TransformerConfig.__post_init__ and, for a launch line, validate_args, built on the CPU through the
children's own model resolution, graphdoctor.config.child_model),
by the static rule catalogue (graphdoctor.rules.check, the path `graphdoctor check` takes, so rules
added to the catalogue apply here too; errors reject, and so does GD219: under `local` the GPT layer's
`attn` / `mlp` scopes are the whole-layer graph and `moe_router` / `moe` graph nothing) and, for `transformer_engine`, by whether Transformer Engine
imports here (graphdoctor.parent.availability.why_unavailable).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphdoctor.config import DiffConfig
from graphdoctor.errors import UsageError
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.rules.finding import Severity

IMPL_ORDER: tuple[str, ...] = ("full_iteration", "local", "transformer_engine")
"""Order in which candidates are listed (and started)."""

DENSE_SCOPES: dict[str, tuple[tuple[str, ...], ...]] = {
    "local": ((), ("attn",), ("mlp",)),
    "transformer_engine": ((), ("attn",), ("mlp",), ("attn", "mlp")),
}
"""cuda_graph_modules tried per implementation for a dense model (() is the whole layer)."""

MOE_SCOPES: dict[str, tuple[tuple[str, ...], ...]] = {
    "local": ((), ("attn",), ("mlp",), ("moe_router",), ("moe",)),
    "transformer_engine": ((), ("attn",), ("mlp",), ("moe_router",), ("moe_router", "moe_preprocess"),
                           ("moe",), ("attn", "moe_router", "moe_preprocess")),
}
"""The same for an MoE model; `mlp` and `moe` are kept so that the models Megatron refuses them for
show the rule that says why."""

TE_FACTS = frozenset({"te_version", "te_has_torch_extension"})
"""Machine facts about Transformer Engine: rules that read them are not repeated for a candidate
already unavailable because Transformer Engine does not import."""

MEGATRON_RULE = "megatron"
"""Rule name of a rejection by Megatron's own TransformerConfig validation."""

NOT_RUN_RULES = frozenset({"GD219"})
"""Warning-level rules whose candidates are not run, like rejected ones: GD219, a `local` scope that
graphs the whole GPT layer (the `local whole layer` candidate already runs that graph) or nothing."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One graph configuration to try."""

    impl: str
    """local | full_iteration | transformer_engine."""
    modules: tuple[str, ...] = ()
    """cuda_graph_modules (empty: the whole layer; always empty for full_iteration)."""
    layers: tuple[int, ...] = ()
    """Decoder layers graphed (empty: every layer); set by the bisection."""

    @property
    def scope(self) -> str:
        """`whole step`, `whole layer`, `attn`, `attn+mlp`, ..."""
        if self.impl == "full_iteration":
            return "whole step"
        return "+".join(self.modules) or "whole layer"

    @property
    def label(self) -> str:
        """`local attn`, `transformer_engine attn (layers 0)`."""
        text = f"{self.impl} {self.scope}"
        if self.layers:
            text += f" (layer{'s' if len(self.layers) > 1 else ''} {','.join(map(str, self.layers))})"
        return text

    @property
    def key(self) -> str:
        """A file-name-safe unique name (children's files are named after it)."""
        key = self.impl if self.impl == "full_iteration" else f"{self.impl}-{'_'.join(self.modules) or 'layer'}"
        return key + ("-L" + "_".join(map(str, self.layers)) if self.layers else "")

    def config(self, base: DiffConfig) -> DiffConfig:
        """The DiffConfig that runs this candidate (one implementation)."""
        modules = () if self.impl == "full_iteration" else self.modules
        return base.replace(impls=(self.impl,), cuda_graph_modules=modules, graph_layers=self.layers)

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"key": self.key, "label": self.label, "impl": self.impl, "modules": list(self.modules),
                "layers": list(self.layers)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        """Inverse of to_dict."""
        return cls(impl=str(data["impl"]), modules=tuple(data.get("modules", ())),
                   layers=tuple(int(i) for i in data.get("layers", ())))


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a candidate is not run: a catalogue rule or Megatron's validation."""

    rule: str
    """GDxxx, or `megatron` (TransformerConfig.__post_init__)."""
    message: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        """JSON view."""
        return {"rule": self.rule, "message": self.message, "fix": self.fix}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rejection:
        """Inverse of to_dict."""
        return cls(rule=str(data["rule"]), message=str(data["message"]), fix=str(data.get("fix", "")))


@dataclass(frozen=True, slots=True)
class Screening:
    """A candidate after the checks that need no GPU."""

    candidate: Candidate
    rejections: tuple[Rejection, ...] = ()
    unavailable: str | None = None
    """Why the implementation cannot run here (Transformer Engine, dtype); None: it can."""
    warnings: tuple[str, ...] = ()
    """Warning-level catalogue findings (`GD401 message`): the candidate still runs."""

    @property
    def runnable(self) -> bool:
        """Neither rejected nor unavailable."""
        return not self.rejections and self.unavailable is None


def is_moe(config: DiffConfig) -> bool:
    """True when the run file's `transformer:` asks for more than one expert."""
    experts = config.transformer.get("num_moe_experts")
    return isinstance(experts, int) and experts > 1


def candidates_for(config: DiffConfig) -> list[Candidate]:
    """Every candidate for the model, for the implementations in config.impls (IMPL_ORDER)."""
    scopes = MOE_SCOPES if is_moe(config) else DENSE_SCOPES
    out: list[Candidate] = []
    for impl in IMPL_ORDER:
        if impl not in config.impls:
            continue
        if impl == "full_iteration":
            out.append(Candidate("full_iteration"))
        else:
            out.extend(Candidate(impl, modules) for modules in scopes[impl])
    return out


def megatron_rejection(candidate: Candidate, config: DiffConfig) -> Rejection | None:
    """Build the candidate's TransformerConfig on the CPU, as its child would (graphdoctor.config.build); its error,
    if any."""
    from graphdoctor.config.build import child_transformer_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            child_transformer_config(candidate.config(config), candidate.impl, config.dropout)
        except (AssertionError, ValueError, TypeError, NotImplementedError, UsageError) as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return Rejection(MEGATRON_RULE, f"TransformerConfig: {text}")
    return None


def catalogue_mapping(candidate: Candidate, config: DiffConfig) -> dict[str, Any]:
    """The run-file mapping the rule catalogue judges for one candidate."""
    transformer = {k: v for k, v in config.transformer.items()
                   if k not in ("cuda_graph_impl", "cuda_graph_modules", "cuda_graph_scope")}
    transformer.update(num_layers=config.num_layers, hidden_size=config.hidden_size,
                       num_attention_heads=config.num_attention_heads, hidden_dropout=config.dropout,
                       attention_dropout=config.dropout, cuda_graph_impl=candidate.impl,
                       cuda_graph_modules=[] if candidate.impl == "full_iteration" else list(candidate.modules),
                       cuda_graph_warmup_steps=config.cuda_graph_warmup_steps)
    if config.dtype in ("bf16", "fp16"):
        transformer[config.dtype] = True
    run: dict[str, Any] = {"seq_length": config.seq_length, "micro_batch_size": config.micro_batch_size}
    run.update({k: v for k, v in (("layer_spec", config.layer_spec), ("model_provider", config.model_provider))
                if v is not None})
    return {"transformer": transformer, "env": dict(config.env), "run": run}


def screen(candidate: Candidate, config: DiffConfig, *, facts: EnvironmentFacts,
           env: Mapping[str, str] | None = None) -> Screening:
    """Screen one candidate: availability, Megatron's validation, the rule catalogue.

    Args:
        candidate: the candidate.
        config: the advise run (model, dtype, dropout, run-file sections).
        facts: the training machine (advise runs there: graphdoctor.rules.facts.detect_facts()).
        env: the children's environment variables the environment rules read.
    """
    from graphdoctor.parent.availability import why_unavailable
    from graphdoctor.rules import check, get_rule

    unavailable = why_unavailable(candidate.impl, config)
    rejections: list[Rejection] = []
    report = check(catalogue_mapping(candidate, config), env=env, facts=facts)
    notes: list[str] = []
    for finding in report.findings:
        if finding.extra.get("not_checked"):
            continue
        if unavailable is not None and TE_FACTS.intersection(get_rule(finding.code).machine_facts):
            continue  # a rule about the installed Transformer Engine says what `unavailable` says
        if finding.severity is Severity.ERROR or finding.code in NOT_RUN_RULES:
            rejections.append(Rejection(finding.code, finding.message, finding.fix or ""))
        elif finding.severity is Severity.WARNING:
            notes.append(f"{finding.code} {finding.message}")
    megatron = megatron_rejection(candidate, config) if config.model is None or config.model.unavailable is None \
        else None
    if megatron is not None:
        rejections.append(megatron)
    return Screening(candidate=candidate, rejections=tuple(rejections), unavailable=unavailable,
                     warnings=tuple(notes))


__all__ = ["DENSE_SCOPES", "IMPL_ORDER", "MEGATRON_RULE", "MOE_SCOPES", "NOT_RUN_RULES", "Candidate", "Rejection", "Screening",
           "candidates_for", "catalogue_mapping", "is_moe", "megatron_rejection", "screen"]
