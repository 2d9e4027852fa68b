"""graphdoctor.rules: the rule model (Rule, Finding, Severity...), the registry and `check()`.

`from graphdoctor.rules import Finding, Severity` is the stable import for probes and reports.
"""

from __future__ import annotations

from graphdoctor.rules.base import DOC_SECTIONS, Hit, Rule
from graphdoctor.rules.batch import BatchReport, CheckInput, check_many
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.engine import SCHEMA_VERSION, CheckReport, build_context, check
from graphdoctor.rules.facts import EnvironmentFacts, detect_facts
from graphdoctor.rules.finding import Finding, FixAvailability, Severity, Status
from graphdoctor.rules.megatron_args import MegatronArgs, parse_megatron_args
from graphdoctor.rules.registry import REMOVED, all_rules, get_rule, rule_fix
from graphdoctor.rules.selection import Selection
from graphdoctor.rules.target import resolve_target

__all__ = [
    "DOC_SECTIONS",
    "REMOVED",
    "SCHEMA_VERSION",
    "BatchReport",
    "CheckContext",
    "CheckInput",
    "CheckReport",
    "EnvironmentFacts",
    "Finding",
    "FixAvailability",
    "Hit",
    "MegatronArgs",
    "Rule",
    "Selection",
    "Severity",
    "Status",
    "all_rules",
    "build_context",
    "check",
    "check_many",
    "detect_facts",
    "get_rule",
    "rule_fix",
    "parse_megatron_args",
    "resolve_target",
]
