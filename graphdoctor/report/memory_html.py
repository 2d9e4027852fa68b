"""One self-contained HTML page for a memory triage report: inline SVG charts, inline CSS, no network.

Charts: allocated bytes over the allocator history (coloured by phase, or by pool when the trace has
no phase tags) and the top allocation sites by live bytes; tables for pools and the diff.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from graphdoctor.report.memory import fmt_bytes

if TYPE_CHECKING:
    from graphdoctor.memory.analysis import TriageReport
    from graphdoctor.memory.phases import Timeline
    from graphdoctor.memory.summary import SiteBytes

_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7",
            "#9c755f", "#bab0ac")
_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left;font-family:monospace}
.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:12px;height:12px;
margin-right:4px;vertical-align:middle}.muted{color:#777}.bad{color:#b00;font-weight:bold}
svg text{font:11px sans-serif;fill:#333}
"""
_W, _H, _PAD_L, _PAD_B, _PAD_T = 1000, 320, 80, 30, 10


def _nice_ticks(top: int, num: int = 5) -> list[int]:
    if top <= 0:
        return [0]
    raw = top / num
    mag = 1 << max(0, int(raw).bit_length() - 1)
    step = next(m * mag for m in (1, 2, 4, 8) if m * mag >= raw)
    return list(range(0, top + step, step))


def timeline_svg(tl: Timeline) -> str:
    """SVG line chart of allocated bytes over trace events, one colour per phase (or pool)."""
    if not tl.event_index:
        return '<p class="muted">No allocator history in this snapshot (record with start_history).</p>'
    ticks = _nice_ticks(max(tl.allocated_bytes))
    y_max, x_max = max(ticks[-1], 1), max(tl.num_events - 1, 1)
    plot_w, plot_h = _W - _PAD_L - 10, _H - _PAD_B - _PAD_T

    def xy(i: int) -> str:
        x = _PAD_L + tl.event_index[i] / x_max * plot_w
        y = _PAD_T + plot_h - tl.allocated_bytes[i] / y_max * plot_h
        return f"{x:.1f},{y:.1f}"

    parts = [f'<svg viewBox="0 0 {_W} {_H}" width="100%" role="img" aria-label="allocated bytes over time">']
    for tick in ticks:
        y = _PAD_T + plot_h - tick / y_max * plot_h
        parts.append(f'<line x1="{_PAD_L}" x2="{_W - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt_bytes(tick)}</text>')
    start = 0
    for i in range(1, len(tl.event_index) + 1):
        if i == len(tl.event_index) or tl.label_index[i] != tl.label_index[start]:
            # Extend each run to the next point so the line stays continuous across colours.
            pts = " ".join(xy(j) for j in range(start, min(i + 1, len(tl.event_index))))
            colour = _PALETTE[tl.label_index[start] % len(_PALETTE)]
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{pts}"/>')
            start = i
    parts.append(f'<text x="{_PAD_L}" y="{_H - 6}">allocator event 0</text>'
                 f'<text x="{_W - 10}" y="{_H - 6}" text-anchor="end">event {tl.num_events - 1}</text></svg>')
    legend = "".join(f'<span><i class="sw" style="background:{_PALETTE[i % len(_PALETTE)]}"></i>{escape(label)}</span>'
                     for i, label in enumerate(tl.labels))
    return "".join(parts) + f'<div class="legend">coloured by {escape(tl.color_by)}: {legend}</div>'


def sites_svg(sites: Sequence[SiteBytes]) -> str:
    """Horizontal bar chart of live bytes by allocation site."""
    if not sites:
        return '<p class="muted">No live blocks.</p>'
    row_h, label_w = 22, 430
    top = max(s.live_bytes for s in sites) or 1
    height = row_h * len(sites) + 6
    parts = [f'<svg viewBox="0 0 {_W} {height}" width="100%" role="img" aria-label="top sites">']
    for i, site in enumerate(sites):
        y = 3 + i * row_h
        width = max(1.0, site.live_bytes / top * (_W - label_w - 110))
        label = site.site if len(site.site) <= 70 else "..." + site.site[-67:]
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{width:.1f}" height="{row_h - 6}" fill="{_PALETTE[0]}">'
            f"<title>{escape(site.site)}: {fmt_bytes(site.live_bytes)} in {site.num_blocks} blocks</title></rect>"
            f'<text x="{label_w + width + 6:.1f}" y="{y + 14}">{fmt_bytes(site.live_bytes)}</text>'
        )
    return "".join(parts) + "</svg>"


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _diff_html(report: TriageReport) -> str:
    diff = report.diff
    if diff is None:
        return ""
    rows = [(g.key, f"{g.num_new} / {fmt_bytes(g.new_bytes)}", f"{g.num_freed} / {fmt_bytes(g.freed_bytes)}",
             f"{g.num_resized} / {fmt_bytes(g.resized_delta_bytes, signed=True)}", fmt_bytes(g.net_bytes, signed=True))
            for g in (diff.total, *diff.by_pool, *diff.by_site)]
    out = [f"<h2>Block diff against {escape(report.against.path if report.against else '')}</h2>",
           _html_table(("pool / site", "new", "freed", "resized", "net live"), rows)]
    if report.leak_suspects:
        suspects = [(s.site, fmt_bytes(s.before_bytes), fmt_bytes(s.after_bytes), fmt_bytes(s.growth_bytes, signed=True))
                    for s in report.leak_suspects]
        out += ['<h2 class="bad">Leak suspects</h2>', _html_table(("site", "before", "after", "growth"), suspects)]
    return "".join(out)


def render_html(report: TriageReport) -> str:
    """The whole page; report.timeline should be set (triage(..., with_timeline=True))."""
    s = report.snapshot
    t = s.totals
    pools = [(g.key, g.num_segments, fmt_bytes(g.reserved_bytes), fmt_bytes(g.live_bytes), fmt_bytes(g.free_bytes))
             for g in s.by_pool]
    body = [
        f"<h1>graphdoctor memory triage: {escape(s.path)}</h1>",
        f"<p>reserved <b>{fmt_bytes(t.reserved_bytes)}</b>, live <b>{fmt_bytes(t.live_bytes)}</b>, "
        f"allocated/reserved <b>{t.allocated_over_reserved:.2f}</b>, graph pools "
        f"<b>{fmt_bytes(t.graph_pool_reserved_bytes)}</b>, {s.num_trace_entries} trace entries</p>",
        "<h2>Allocated bytes over the recorded history</h2>",
        timeline_svg(report.timeline) if report.timeline else '<p class="muted">Timeline not computed.</p>',
        "<h2>Top allocation sites (live bytes)</h2>",
        sites_svg(s.top_sites),
        "<h2>Pools</h2>",
        _html_table(("pool", "segments", "reserved", "live", "cached free"), pools),
        _diff_html(report),
    ]
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>graphdoctor memory triage</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")


__all__ = ["render_html", "sites_svg", "timeline_svg"]
