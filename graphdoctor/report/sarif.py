"""SARIF 2.1.0 output of `graphdoctor check` for code-scanning tools: the rule catalogue in
`tool.driver.rules`, one result per finding, paths relative to the working directory (%SRCROOT%).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from graphdoctor.envelope import tool_info
from graphdoctor.report.annotations import locate

if TYPE_CHECKING:
    from graphdoctor.rules.base import Rule
    from graphdoctor.rules.batch import BatchReport

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _rule_descriptor(rule: Rule) -> dict[str, Any]:
    meta = rule.metadata()
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": meta["summary"] or rule.name},
        "fullDescription": {"text": meta["summary"] or rule.name},
        "help": {"text": rule.doc(), "markdown": rule.doc()},
        "defaultConfiguration": {"level": _LEVEL[meta["severity"]]},
        "properties": {"family": rule.family, "fix": meta["fix"], "status": meta["status"],
                       "runtime": rule.runtime, "tags": [rule.family]},
    }


def _uri(path: str, root: Path) -> tuple[str, bool]:
    """(uri, relative to %SRCROOT%) for a path on disk."""
    resolved = Path(path).resolve()
    try:
        return quote(resolved.relative_to(root).as_posix()), True
    except ValueError:
        return resolved.as_uri(), False


def _result(report: BatchReport, index: dict[str, int], root: Path) -> list[dict[str, Any]]:
    results = []
    for check_input, finding in report.findings():
        result: dict[str, Any] = {
            "ruleId": finding.code,
            "level": _LEVEL[finding.severity.value],
            "message": {"text": finding.message + (f" Fix: {finding.fix}" if finding.fix else "")},
            "properties": {"input": check_input.label, "fields": list(finding.fields), "source": finding.source},
        }
        if finding.code in index:
            result["ruleIndex"] = index[finding.code]
        pos = locate(check_input, finding)
        if pos.in_file:
            uri, relative = _uri(pos.path, root)
            artifact: dict[str, Any] = {"uri": uri}
            if relative:
                artifact["uriBaseId"] = "%SRCROOT%"
            result["locations"] = [{"physicalLocation": {
                "artifactLocation": artifact,
                "region": {"startLine": pos.line, "startColumn": pos.column},
            }}]
        results.append(result)
    return results


def sarif_log(report: BatchReport, root: Path | None = None) -> dict[str, Any]:
    """The SARIF log object (one run)."""
    from graphdoctor.rules import all_rules

    root = (root or Path.cwd()).resolve()
    rules = all_rules()
    index = {rule.code: i for i, rule in enumerate(rules)}
    notifications = [{"level": "error", "message": {"text": f"{r.input.label}: {r.error}"}}
                     for r in report.results if r.error is not None]
    notes = [{"level": "note", "message": {"text": n}} for r in report.results if r.report is not None
             for n in r.report.notes]
    info = tool_info()
    run: dict[str, Any] = {
        "tool": {"driver": {"name": info["name"], "version": info["version"],
                            "rules": [_rule_descriptor(rule) for rule in rules]}},
        "originalUriBaseIds": {"%SRCROOT%": {"uri": root.as_uri() + "/"}},
        "invocations": [{"executionSuccessful": not notifications,
                         "toolExecutionNotifications": notifications + notes,
                         "properties": {"target": report.facts.source}}],
        "results": _result(report, index, root),
    }
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def render_sarif(report: BatchReport) -> str:
    """The SARIF log as indented JSON."""
    return json.dumps(sarif_log(report), indent=2) + "\n"


__all__ = ["SARIF_SCHEMA", "SARIF_VERSION", "render_sarif", "sarif_log"]
