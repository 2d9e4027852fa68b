"""Every rule's bad fixture flags exactly its marked lines; its good fixture does not flag the rule.

Fixtures live in fixtures/rules/: GDxxx_bad|good.yaml (run files) or .txt (Megatron-LM launch lines), checked here
by the static check; a `# facts: k=v` header overrides the pinned EnvironmentFacts below. The runtime rules' .py
fixtures run on a GPU instead: tests/gpu/test_rule_fixtures_gpu.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.rules import EnvironmentFacts, all_rules, check

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules"
PINNED = EnvironmentFacts(te_version="2.12.0", torch_version="2.11.0", torch_has_stale_capture_override=True,
                          torch_has_graph_safe_rng=True, gpu_capability=None)
RULES = all_rules()
STATIC_RULES = [r for r in RULES if not r.runtime]
"""Rules the static check reports; the runtime ones are run by tests/gpu/test_rule_fixtures_gpu.py."""
SETTLED_BY_MEGATRON = {"GD116": "te_rng_tracker is not enabled, enabling it for CUDA graphs"}
"""Rules whose bad fixture Megatron-LM's validate_args fixes by itself, wherever megatron.training imports (as it does
here): the rule stays silent and the note quotes Megatron."""


def fixture(code: str, kind: str) -> Path:
    matches = sorted(FIXTURES.glob(f"{code}_{kind}.*"))
    assert len(matches) == 1, f"{code}: expected one {kind} fixture, found {[m.name for m in matches]}"
    return matches[0]


def _fact_value(text: str) -> Any:
    return {"null": None, "true": True, "false": False}.get(text, text)


def facts_for(path: Path) -> EnvironmentFacts:
    overrides: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        if line.startswith("# facts:"):
            for item in line.removeprefix("# facts:").split(","):
                key, _, value = item.strip().partition("=")
                overrides[key] = _fact_value(value)
    return PINNED.with_overrides(overrides)


def marked_lines(path: Path, code: str) -> set[int]:
    return {n for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(rf"#.*\[{code}\]", line)}


def run(path: Path) -> list[Any]:
    facts = facts_for(path)
    if path.suffix == ".txt":
        return list(check(None, f"@{path}", facts=facts).findings)
    return list(check(path, facts=facts).findings)


def flagged_lines(findings: list[Any], path: Path) -> set[int]:
    return {int(loc.rsplit(":", 1)[1]) for f in findings for loc in f.locations if loc.startswith(f"{path}:")}


@pytest.mark.parametrize("rule", STATIC_RULES, ids=lambda r: r.code)
def test_bad_fixture_flags_exactly_marked_lines(rule: Any) -> None:
    path = fixture(rule.code, "bad")
    marked = marked_lines(path, rule.code)
    assert marked, f"{path.name}: no line marked # [{rule.code}]"
    if rule.code in SETTLED_BY_MEGATRON:
        report = check(None, f"@{path}", facts=facts_for(path))
        assert rule.code not in report.codes()
        assert any(SETTLED_BY_MEGATRON[rule.code] in note for note in report.notes), report.notes
        return
    findings = [f for f in run(path) if f.code == rule.code]
    assert findings, f"{path.name}: {rule.code} not reported"
    assert flagged_lines(findings, path) == marked


@pytest.mark.parametrize("rule", STATIC_RULES, ids=lambda r: r.code)
def test_good_fixture_does_not_flag(rule: Any) -> None:
    path = fixture(rule.code, "good")
    assert not marked_lines(path, rule.code)
    assert rule.code not in [f.code for f in run(path)]


def test_static_check_never_reports_runtime_rules() -> None:
    runtime = {r.code for r in RULES if r.runtime}
    for path in FIXTURES.glob("GD*_bad.*"):
        if path.suffix != ".py":
            assert not runtime & {f.code for f in run(path)}
