"""CheckContext: everything a static rule may look at, already merged, validated and normalised.

Sources, lowest priority first: TransformerConfig defaults, Megatron-LM defaults (only when a launch
line is given), the run file, the launch line. `value(name)` answers for any TransformerConfig field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphdoctor.config.bridge import BridgeConfig
from graphdoctor.config.graph_settings import GraphSettings, normalize
from graphdoctor.config.megatron_lm import NO_DEFAULT, transformer_fields, validate_transformer
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.rules.megatron_args import (
    ARGS_DEFAULTS,
    TRANSFORMER_DEFAULTS_FROM_ARGS,
)
from graphdoctor.rules.megatron_reading import MegatronReading


@dataclass(frozen=True, slots=True)
class CheckContext:
    """The merged view the rules inspect."""

    transformer: dict[str, Any]
    """TransformerConfig fields given explicitly (run file and launch line)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Megatron-LM-only settings given on the launch line (`args.*`)."""
    run: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    facts: EnvironmentFacts = field(default_factory=EnvironmentFacts)
    megatron_lm: bool = False
    """A Megatron-LM launch line was given: its defaults and its validate_args rules apply."""
    megatron: MegatronReading | None = None
    """What Megatron-LM's parser and validate_args made of the line (None without one)."""
    bridge: BridgeConfig | None = None
    """The input is a Megatron-Bridge ConfigContainer (None for a run file, a functional test or a launch line):
    Bridge's own refusals apply (GD141-GD145) and the Megatron-LM rules they replace stand down."""
    graph: GraphSettings = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "graph", normalize(self.value))

    def value(self, name: str) -> Any:
        """Effective value of a TransformerConfig field as given (before __post_init__ rewrites)."""
        if name in self.transformer:
            return self.transformer[name]
        if self.megatron_lm and name in TRANSFORMER_DEFAULTS_FROM_ARGS:
            return TRANSFORMER_DEFAULTS_FROM_ARGS[name]
        default = transformer_fields()[name][1]
        return None if default is NO_DEFAULT else default

    def arg(self, name: str) -> Any:
        """A Megatron-LM setting (`args.*`): given value or Megatron-LM's default."""
        return self.args.get(name, ARGS_DEFAULTS.get(name))

    @property
    def training_graphs(self) -> bool:
        """The run captures graphs while training (a Megatron-LM line for the inference scripts, or train_rl.py
        without --rl-training-cuda-graphs, captures inference graphs only)."""
        return self.megatron is None or self.megatron.training_graphs

    @property
    def recompute_granularity(self) -> str | None:
        """After the deprecated moe_layer_recompute rewrite (transformer_config.py:1836-1846)."""
        if self.value("moe_layer_recompute") and self.value("recompute_granularity") != "full":
            return "selective"
        return self.value("recompute_granularity")

    @property
    def recompute_modules(self) -> list[str]:
        """None -> ['core_attn'] (transformer_config.py:1758), plus 'moe' for moe_layer_recompute."""
        modules = self.value("recompute_modules")
        modules = ["core_attn"] if modules is None else list(modules)
        if self.value("moe_layer_recompute") and "moe" not in modules:
            modules.append("moe")
        return modules

    @property
    def capacity_factor(self) -> float | None:
        """A negative moe_expert_capacity_factor means None (transformer_config.py:1661)."""
        factor = self.value("moe_expert_capacity_factor")
        return None if factor is None or factor < 0 else factor

    @property
    def is_moe(self) -> bool:
        """num_moe_experts > 1."""
        experts = self.value("num_moe_experts")
        return experts is not None and experts > 1

    @property
    def offload_modules(self) -> list[str]:
        """offload_modules or []."""
        return list(self.value("offload_modules") or [])


__all__ = ["CheckContext", "transformer_fields", "validate_transformer"]
