"""Render check results and rule documentation: full text (a block per finding, report/findings_full.py), a table
that fits the terminal, JSON (the envelope of graphdoctor/envelope.py) or Markdown; concise, github and sarif live in
report/annotations.py and report/sarif.py, dispatched from `render_batch`. Returns strings, never prints.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tabulate import tabulate

from graphdoctor.envelope import envelope
from graphdoctor.errors import UsageError
from graphdoctor.report.escape import escape_control
from graphdoctor.report.table import fit_table, terminal_width

if TYPE_CHECKING:
    from graphdoctor.rules.base import Rule
    from graphdoctor.rules.batch import BatchReport
    from graphdoctor.rules.engine import CheckReport

FORMATS: tuple[str, ...] = ("text", "json", "md")
OUTPUT_FORMATS: tuple[str, ...] = ("full", "table", "concise", "json", "github", "sarif", "markdown")
"""`check --output-format` choices (`text` is accepted as a spelling of `full`, `md` of `markdown`)."""


def _short_field(name: str) -> str:
    return name.removeprefix("transformer.")


def _where(fields: Sequence[str], locations: Sequence[str], sep: str = "\n", label: str | None = None) -> str:
    # one token per line: a key or a path:line is never split across lines; locations in the
    # input's own file are shortened to `line N` under that input's heading
    def short(location: str) -> str:
        path, _, line = location.rpartition(":")
        return f"line {line}" if label is not None and path == label and line.isdigit() else location

    return sep.join([*(_short_field(f) for f in fields), *(short(loc) for loc in locations)]).strip()


_HEADERS = ["code", "name", "severity", "fields", "message", "fix"]
WIDE_TABLE = 150
"""From this terminal width on the table tries separate name, severity and fields columns (kept
when the unbreakable keys and paths let it fit)."""


def _summary(counts: dict[str, int]) -> str:
    return f"{sum(counts.values())} finding(s): {counts['error']} error, {counts['warning']} warning, {counts['info']} info"


def _text_table(report: CheckReport, width: int | None, label: str | None = None) -> list[str]:
    if not report.findings:
        return ["No findings."]
    width = width or terminal_width()
    if width >= WIDE_TABLE:
        rows = [[f.code, f.name, f.severity.value, _where(f.fields, f.locations, label=label), f.message, f.fix]
                for f in report.findings]
        table = fit_table(_HEADERS, rows, prose=(4, 5), width=width)
        if max(len(line) for line in table.splitlines()) <= width:
            return [table]
    # narrow terminals: the rule, its keys and lines stacked in one column, message and fix in the other
    rows = [[f"{f.code} {f.severity.value}\n{f.name}\n{_where(f.fields, f.locations, label=label)}",
             f.message + (f"\nfix: {f.fix}" if f.fix else "")] for f in report.findings]
    return [fit_table(["rule / fields", "message / fix"], rows, prose=(1,), width=width)]


def _md_table(report: CheckReport) -> str:
    rows = [[f.code, f.name, f.severity.value, _where(f.fields, f.locations, "<br>"), f.message, f.fix]
            for f in report.findings]
    return tabulate(rows, _HEADERS, tablefmt="github") if rows else "No findings."


def render_report(report: CheckReport, fmt: str = "text", width: int | None = None) -> str:
    """Render one CheckReport: `text` (table + notes + summary), `json` (enveloped) or `md`."""
    if fmt == "json":
        return json.dumps(envelope("check", report.to_dict()), indent=2, default=str) + "\n"
    summary = _summary(report.to_dict()["counts"])
    if fmt in ("md", "markdown"):
        notes = "".join(f"\n- {n}" for n in report.notes)
        return escape_control(f"{_md_table(report)}\n\n{summary}\n" + (f"\nNotes:{notes}\n" if notes else ""))
    if fmt != "text":
        raise ValueError(f"format: got {fmt!r}, expected one of {', '.join(FORMATS)}")
    parts = _text_table(report, width)
    parts.extend(f"note: {n}" for n in _notes(report))
    parts.append(summary)
    return escape_control("\n".join(parts) + "\n")


def _notes(report: CheckReport) -> list[str]:
    line = report.not_checked_line()
    return [*report.notes, *([line] if line else [])]


def _batch_text(batch: BatchReport, width: int | None, style: str) -> str:
    """`full` (a block per finding), `table` or `markdown`, for every input."""
    from graphdoctor.report.findings_full import note_lines, report_blocks

    parts: list[str] = []
    several = len(batch.results) > 1
    markdown = style == "markdown"
    for result in batch.results:
        if several:
            parts.append(f"## {result.input.label}" if markdown else f"{result.input.label}:")
        if result.error is not None:
            parts.append(f"error: {result.error}")
        elif result.report is not None:
            if markdown:
                parts.append(_md_table(result.report))
                parts.extend("- " + n for n in _notes(result.report))
            elif style == "table":
                parts.append("\n".join(_text_table(result.report, width, result.input.label)))
                parts.extend("note: " + n for n in _notes(result.report))
            else:
                parts.extend(report_blocks(result.report, width))
                parts.extend(note_lines(_notes(result.report), width))
        if several:
            parts.append("")
    parts.extend(("- " + n for n in batch.notes) if markdown else note_lines(batch.notes, width))
    summary = _summary(batch.counts()) + (f" in {len(batch.results)} inputs" if several else "")
    if batch.num_input_errors:
        summary += f"; {batch.num_input_errors} input(s) could not be checked"
    parts.append(summary)
    return "\n".join(parts) + "\n"


def render_batch(batch: BatchReport, fmt: str = "text", width: int | None = None) -> str:
    """Render `check` over one or more inputs in any of OUTPUT_FORMATS.

    Raises:
        UsageError: an unknown format.
    """
    if fmt == "json":
        return json.dumps(envelope("check", batch.to_payload()), indent=2, default=str) + "\n"
    if fmt in ("text", "full", "table", "markdown", "md"):
        style = {"text": "full", "md": "markdown"}.get(fmt, fmt)
        return _batch_text(batch, width, style)
    if fmt in ("concise", "github"):
        from graphdoctor.report.annotations import render_concise, render_github

        return render_concise(batch) if fmt == "concise" else render_github(batch)
    if fmt == "sarif":
        from graphdoctor.report.sarif import render_sarif

        return render_sarif(batch)
    raise UsageError(f"output format: got {fmt!r}, expected one of {', '.join(OUTPUT_FORMATS)}")


def rule_markdown(rule: Rule) -> str:
    """One rule's documentation page (docs/rules/GDxxx.md)."""
    meta = rule.metadata()
    head = [
        f"# {rule.name} ({rule.code})",
        "",
        f"Family: **{rule.family}**. Severity: **{meta['severity']}**. Status: {meta['status']} "
        f"(since {rule.since}). {meta['fix_availability']}"
        + (f" Detected on the GPU by {rule.detected_by}, not by the static check."
           if rule.runtime else ""),
        "",
    ]
    return "\n".join(head) + rule.doc() + "\n"


def rules_index_markdown(rules: Sequence[Rule]) -> str:
    """docs/rules/index.md: one table row per rule."""
    rows = [[f"[{r.code}]({r.code}.md)", r.name, r.family, r.severity.value, r.fix.value, r.status.value, r.summary()]
            for r in rules]
    table = tabulate(rows, ["code", "name", "family", "severity", "fix", "status", "summary"], tablefmt="github")
    return ("# graphdoctor rules\n\nGenerated by `graphdoctor rules --format md --output docs/rules`; do not edit.\n\n"
            f"{table}\n")


def render_rules(rules: Sequence[Rule], fmt: str = "text") -> str:
    """The catalogue as a text table, a JSON list or one Markdown index."""
    if fmt == "json":
        return json.dumps(envelope("rules", {"rules": [r.metadata() for r in rules]}), indent=2) + "\n"
    if fmt == "md":
        return rules_index_markdown(rules)
    rows = [[r.code, r.name, r.family, r.severity.value, r.fix.value, r.status.value] for r in rules]
    return tabulate(rows, ["code", "name", "family", "severity", "fix", "status"], tablefmt="simple") + "\n"


def render_rule(rule: Rule, fmt: str = "text") -> str:
    """`graphdoctor rule CODE`: name, code, family, severity, fix availability, status, full doc."""
    if fmt == "json":
        return json.dumps(envelope("rule", rule.metadata()), indent=2) + "\n"
    if fmt == "md":
        return rule_markdown(rule)
    meta = rule.metadata()
    lines = [
        f"# {rule.name} ({rule.code})",
        "",
        f"Family: {rule.family}",
        f"Severity: {meta['severity']}",
        meta["fix_availability"],
        f"Status: {meta['status']} (since {rule.since})",
        *([f"Detected on the GPU by {rule.detected_by}, not by the static check."]
          if rule.runtime else []),
        "",
        rule.doc(),
    ]
    return "\n".join(lines) + "\n"


__all__ = ["FORMATS", "OUTPUT_FORMATS", "render_batch", "render_report", "render_rule", "render_rules", "rule_markdown", "rules_index_markdown"]
