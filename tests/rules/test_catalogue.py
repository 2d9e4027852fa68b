"""Guard tests for the rule catalogue: frozen code list, metadata, doc sections, generated docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphdoctor.report.findings import rule_markdown, rules_index_markdown
from graphdoctor.rules import DOC_SECTIONS, REMOVED, Rule, Severity, all_rules, get_rule
from graphdoctor.rules.base import CODE_PATTERN, NAME_PATTERN

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules"
RULES = all_rules()

# Codes are never reused or renumbered: extend this list, never edit it (retire into REMOVED).
EXPECTED_CODES = [
    "GD101", "GD102", "GD103", "GD104", "GD105", "GD106", "GD107", "GD108", "GD109", "GD110", "GD111",
    "GD112", "GD113", "GD114", "GD115", "GD116", "GD117", "GD130", "GD131",
    "GD141", "GD142", "GD143", "GD144", "GD145",
    "GD201", "GD202", "GD203", "GD204", "GD205", "GD206", "GD207", "GD208", "GD209", "GD210", "GD211",
    "GD212", "GD213", "GD214", "GD215", "GD216", "GD217", "GD218", "GD219", "GD220",
    "GD221", "GD222", "GD223", "GD224", "GD225", "GD226",
    "GD231", "GD232", "GD233", "GD234", "GD235", "GD236", "GD237", "GD238", "GD239", "GD240",
    "GD301", "GD302", "GD303", "GD304", "GD305", "GD306", "GD307", "GD308", "GD309", "GD310", "GD311", "GD312",
    "GD401", "GD402", "GD403", "GD404", "GD405", "GD406", "GD407",
    "GD501", "GD502", "GD503", "GD504", "GD505", "GD506", "GD507", "GD508", "GD509", "GD510",
    "GD511", "GD513", "GD514", "GD515", "GD516", "GD517", "GD518", "GD519", "GD520", "GD521", "GD522",
]
RUNTIME_NAMES = [
    "host-sync-in-capture", "data-dependent-shape", "legacy-default-stream-work", "pageable-h2d-copy",
    "unregistered-generator", "host-drawn-random-mask", "cpu-tensor-in-capture", "forward-hook-in-capture",
    "attribute-tensor-reassigned", "capture-invalidated-cascade", "te-graph-none-attention-mask",
    "frozen-logged-value", "eval-after-train-divergence", "logged-value-at-capture", "teardown-hang",
    "rank-divergent-collective", "host-value-baked", "capture-dependent-branch", "graph-buffer-kept", "fp8-state-rebound",
    "captured-tensor-rebound",
]
NOT_IMPERATIVE = ("you ", "the ", "this ", "it ", "consider", "should", "must")


def test_code_list_is_frozen() -> None:
    assert [r.code for r in RULES] == EXPECTED_CODES
    assert len(RULES) >= 40
    assert not set(REMOVED) & set(EXPECTED_CODES)


def test_runtime_rules_in_order() -> None:
    runtime = [r for r in RULES if r.runtime]
    assert [r.code for r in runtime] == [f"GD5{n:02d}" for n in range(1, 12)] + ["GD513", "GD514", "GD515", "GD516", "GD517", "GD518", "GD519", "GD520", "GD521", "GD522"]
    assert [r.name for r in runtime] == RUNTIME_NAMES


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_rule_metadata(rule: Rule) -> None:
    assert CODE_PATTERN.match(rule.code) and NAME_PATTERN.match(rule.name)
    assert rule.since == "0.1" and rule.family and isinstance(rule.severity, Severity)
    assert get_rule(rule.code) is rule and get_rule(rule.name) is rule
    sections = rule.doc_sections()
    for section in DOC_SECTIONS:
        assert sections.get(section), f"{rule.code}: missing or empty section {section!r}"
    fix = rule.fix_template.format_map(_Blank())
    assert fix[0].isupper() and not fix.lower().startswith(NOT_IMPERATIVE), f"{rule.code}: {fix!r}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_docs_are_current(rule: Rule) -> None:
    page = DOCS / f"{rule.code}.md"
    assert page.is_file(), f"{page} missing: run `graphdoctor rules --format md --output docs/rules`"
    assert page.read_text(encoding="utf-8") == rule_markdown(rule), f"{page} is stale; regenerate docs/rules"


def test_docs_index_current_and_no_orphans() -> None:
    assert (DOCS / "index.md").read_text(encoding="utf-8") == rules_index_markdown(RULES)
    assert {p.stem for p in DOCS.glob("GD*.md")} == set(EXPECTED_CODES)


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "x"
