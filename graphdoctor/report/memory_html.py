"""One self-contained HTML page for a memory triage report, in the look of the diff page.

Stylesheet and page shell from report.html_page, charts from report.svg: allocated bytes over the
allocator history (coloured by phase, or by pool when the trace has no phase tags) and the top
allocation sites by live bytes; tables for pools and the block diff.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from graphdoctor.report.html_page import figure, page, table, tile
from graphdoctor.report.memory import fmt_bytes
from graphdoctor.report.svg import PALETTE, Series, bar_chart, timeline_chart

if TYPE_CHECKING:
    from graphdoctor.memory.analysis import TriageReport
    from graphdoctor.memory.phases import Timeline
    from graphdoctor.memory.summary import SiteBytes

_SITE_CHARS = 72


def timeline_svg(tl: Timeline) -> str:
    """SVG line chart of allocated bytes over trace events, one colour per phase (or pool)."""
    if not tl.event_index:
        return '<p class="muted">No allocator history in this snapshot (record with start_history).</p>'
    chart = timeline_chart(tl.event_index, [float(b) for b in tl.allocated_bytes], tl.label_index, tl.labels,
                           title="allocated bytes over time", y_format=lambda v: fmt_bytes(v), byte_axis=True,
                           x_label=f"allocator event (of {tl.num_events})")
    return chart + f'<p class="muted small">coloured by {escape(tl.color_by)}</p>'


def sites_svg(sites: Sequence[SiteBytes]) -> str:
    """Horizontal bar chart of live bytes by allocation site."""
    if not sites:
        return '<p class="muted">No live blocks.</p>'
    labels = [s.site if len(s.site) <= _SITE_CHARS else "..." + s.site[-(_SITE_CHARS - 3):] for s in sites]
    series = Series("live bytes", tuple(float(s.live_bytes) for s in sites), PALETTE[0])
    return bar_chart(labels, [series], title="top sites", value_format=lambda v: fmt_bytes(v), width=1080,
                     label_width=min(500, 7 * max(len(label) for label in labels) + 20))


def _diff_html(report: TriageReport) -> str:
    diff = report.diff
    if diff is None:
        return ""
    rows = [(g.key, f"{g.num_new} / {fmt_bytes(g.new_bytes)}", f"{g.num_freed} / {fmt_bytes(g.freed_bytes)}",
             f"{g.num_resized} / {fmt_bytes(g.resized_delta_bytes, signed=True)}", fmt_bytes(g.net_bytes, signed=True))
            for g in (diff.total, *diff.by_pool, *diff.by_site)]
    against = escape(report.against.path if report.against else "")
    out = [f'<section id="diff"><h2>Block diff against {against}</h2>',
           table(("pool / site", "new", "freed", "resized", "net live"), rows, numeric=(1, 2, 3, 4)), "</section>"]
    if report.leak_suspects:
        suspects = [(s.site, fmt_bytes(s.before_bytes), fmt_bytes(s.after_bytes), fmt_bytes(s.growth_bytes, signed=True))
                    for s in report.leak_suspects]
        out += ['<section id="leaks"><h2>Leak suspects</h2>',
                table(("site", "before", "after", "growth"), suspects, numeric=(1, 2, 3),
                      highlight=range(len(suspects))), "</section>"]
    return "".join(out)


def render_html(report: TriageReport) -> str:
    """The whole page; report.timeline should be set (triage(..., with_timeline=True))."""
    s = report.snapshot
    t = s.totals
    pools = [(g.key, g.num_segments, fmt_bytes(g.reserved_bytes), fmt_bytes(g.live_bytes), fmt_bytes(g.free_bytes))
             for g in s.by_pool]
    tiles = "".join([tile("reserved", fmt_bytes(t.reserved_bytes)), tile("live", fmt_bytes(t.live_bytes)),
                     tile("allocated / reserved", f"{t.allocated_over_reserved:.2f}"),
                     tile("graph pools", fmt_bytes(t.graph_pool_reserved_bytes)),
                     tile("trace entries", str(s.num_trace_entries))])
    timeline = timeline_svg(report.timeline) if report.timeline else '<p class="muted">Timeline not computed.</p>'
    body = [f'<section id="totals"><h2>Totals</h2><div class="tiles">{tiles}</div></section>',
            f'<section id="timeline"><h2>Allocated bytes over the recorded history</h2>'
            f"{figure('allocated bytes after each allocator event', timeline)}</section>",
            f'<section id="sites"><h2>Top allocation sites (live bytes)</h2>{sites_svg(s.top_sites)}</section>',
            '<section id="pools"><h2>Pools</h2>'
            + table(("pool", "segments", "reserved", "live", "cached free"), pools, numeric=(1, 2, 3, 4))
            + "</section>",
            _diff_html(report)]
    toc = [("totals", "totals"), ("timeline", "timeline"), ("sites", "sites"), ("pools", "pools")]
    if report.diff is not None:
        toc.append(("diff", "diff"))
    num_suspects = len(report.leak_suspects)
    mark, cls = ("\u2717", "bad") if num_suspects else ("\u2713", "ok")
    status = (f'<span class="badge {cls}" id="overall">{mark} {num_suspects} leak suspect(s)</span>'
              if report.diff is not None else "")
    return page(title=f"graphdoctor memory triage: {s.path}", heading="graphdoctor memory triage",
                subtitle=s.path, status_html=status, toc=toc, body="".join(body),
                footer="graphdoctor triage --html; one file, no network.")


__all__ = ["render_html", "sites_svg", "timeline_svg"]
