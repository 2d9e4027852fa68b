"""The rule registry: discovers every Rule in graphdoctor.checks; single source of truth code -> rule.

Family modules are found by package discovery (no hand-kept import list); each declares `FAMILY`.
Retired codes stay in REMOVED forever so that they are never reused.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from graphdoctor.errors import UsageError
from graphdoctor.rules.base import CODE_PATTERN, NAME_PATTERN, Rule

REMOVED: dict[str, str] = {}
"""Retired code -> one line saying why and what replaces it (empty in 0.1; codes are never reused)."""

CHECKS_PACKAGE = "graphdoctor.checks"


@cache
def _load() -> dict[str, Rule]:
    package = importlib.import_module(CHECKS_PACKAGE)
    rules: dict[str, Rule] = {}
    names: set[str] = set()
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("gd"):
            continue
        module = importlib.import_module(f"{CHECKS_PACKAGE}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, str):
            raise TypeError(f"{module.__name__}: missing FAMILY string")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Rule) and obj.__module__ == module.__name__ \
                    and "code" in vars(obj):
                _register(obj, family, rules, names)
    return dict(sorted(rules.items()))


def _register(cls: type[Rule], family: str, rules: dict[str, Rule], names: set[str]) -> None:
    code, name = cls.code, cls.name
    if not CODE_PATTERN.match(code) or not NAME_PATTERN.match(name):
        raise ValueError(f"{cls.__name__}: bad code {code!r} or name {name!r}")
    if code in rules or code in REMOVED:
        raise ValueError(f"{cls.__name__}: code {code} is already registered or retired")
    if name in names:
        raise ValueError(f"{cls.__name__}: name {name} is already registered")
    cls.family = family
    rules[code] = cls()
    names.add(name)


def all_rules() -> list[Rule]:
    """Every registered rule, sorted by code."""
    return list(_load().values())


def get_rule(code_or_name: str) -> Rule:
    """Look a rule up by code (GD101, case-insensitive) or by name.

    Raises:
        UsageError: unknown or retired code/name.
    """
    rules = _load()
    key = code_or_name.strip()
    rule = rules.get(key.upper())
    if rule is not None:
        return rule
    for candidate in rules.values():
        if candidate.name == key:
            return candidate
    if key.upper() in REMOVED:
        raise UsageError(f"rule {key.upper()} was removed: {REMOVED[key.upper()]}")
    raise UsageError(f"rule: got {code_or_name!r}, expected a code like GD101 (see `graphdoctor rules`)")


def rule_fix(code: str) -> str:
    """The catalogue's fix for rule `code`: its imperative fix title (diagnoses take it from here)."""
    return get_rule(code).fix_title()


__all__ = ["REMOVED", "all_rules", "get_rule", "rule_fix"]
