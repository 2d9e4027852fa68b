"""One self-contained HTML page of an AdviseReport (`graphdoctor advise --html PATH`), built from the
page parts of the diff report (graphdoctor.report.html_page): recommendation, candidates, bisections,
rejections."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from graphdoctor.report.advise import HEADERS, bisection_lines, recommendation_lines, table_rows
from graphdoctor.report.html_page import page, stopped_badge, table, tile
from graphdoctor.report.memory import fmt_bytes

if TYPE_CHECKING:
    from graphdoctor.advise import AdviseReport


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{escape(anchor)}"><h2>{escape(title)}</h2>{body}</section>'


def _lines(lines: list[str]) -> str:
    return "<pre>" + escape("\n".join(lines)) + "</pre>" if lines else "<p>none</p>"


def _recommendation(report: AdviseReport) -> str:
    rec = report.recommendation
    tiles = ""
    if rec.candidate is not None:
        spread = f" ({rec.speedup_range[0]:.2f}-{rec.speedup_range[1]:.2f})" if rec.speedup_range else ""
        tiles = "".join([
            tile("configuration", rec.candidate.label, state="ok"),
            tile("speedup", f"{rec.speedup:.2f}x{spread}" if rec.speedup is not None else "-"),
            tile("graph pools", fmt_bytes(rec.graph_pool_bytes) if rec.graph_pool_bytes is not None else "-"),
            tile("peak reserved", f"{rec.peak_reserved_over_eager:.2f}x eager"
                 if rec.peak_reserved_over_eager is not None else "-")])
        tiles = f'<div class="tiles">{tiles}</div>'
    return _section("recommendation", "recommendation", tiles + _lines(recommendation_lines(rec)))


def render_html(report: AdviseReport) -> str:
    """The page (no script, no external resource)."""
    cfg = report.config
    rejected = [f"{r.candidate.label}: {x.rule} {x.message}" for r in report.candidates for x in r.rejections]
    not_run = [f"{r.candidate.label}: {r.reason}" for r in report.not_run]
    body = "".join([
        _recommendation(report),
        _section("candidates", "candidates", table(HEADERS, table_rows(report), wrap=(1, 8))),
        _section("bisection", "bisection", _lines(bisection_lines(report))),
        _section("rejected", "rejected before any GPU run", _lines(rejected)),
        _section("not-run", f"not run ({f'stopped by {report.stopped}' if report.stopped else 'budget'})",
                 _lines(not_run)),
    ])
    passed = report.exit_code() == 0
    status = (f'<span class="badge {"ok" if passed else "bad"}" id="overall" data-verdict="'
              f'{"pass" if passed else "fail"}">{"PASS" if passed else "FAIL"} (exit {report.exit_code()})</span>')
    if report.stopped is not None:
        status = stopped_badge(report.stopped, report.exit_code(), f"{len(report.candidates)} candidate(s)")
    subtitle = (f"GPTModel {cfg.num_layers}x{cfg.hidden_size} \u00b7 {cfg.dtype} \u00b7 dropout {cfg.dropout:g} "
                f"\u00b7 layer spec {cfg.layer_spec or 'local'} \u00b7 wall {report.wall_s:.1f} s")
    toc = [("recommendation", "recommendation"), ("candidates", "candidates"), ("bisection", "bisection"),
           ("rejected", "rejected"), ("not-run", "not run")]
    return page(title="graphdoctor advise", heading="graphdoctor advise", subtitle=subtitle, status_html=status,
                toc=toc, body=body, footer="graphdoctor advise; one file, no network.")


__all__ = ["render_html"]
