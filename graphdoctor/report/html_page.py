"""The look shared by every graphdoctor HTML page: one stylesheet (screen and print), the page shell,
tables, verdict badges and key-figure tiles. Diff reports (report.html) and memory triage
(report.memory_html) both build on it; charts come from report.svg.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

CSS = """
:root{--ink:#111827;--muted:#6b7280;--line:#e5e7eb;--panel:#fff;--bg:#f3f4f6;--ok:#047857;--okbg:#d1fae5;
--warn:#92400e;--warnbg:#fef3c7;--bad:#b91c1c;--badbg:#fee2e2;--na:#4b5563;--nabg:#e5e7eb;--accent:#2563eb}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,
"Noto Sans","DejaVu Sans",sans-serif}
main{max-width:1180px;margin:0 auto;padding:0 20px 40px}
header.top{background:#111827;color:#f9fafb;padding:18px 0 16px;margin-bottom:18px}
header.top .in{max-width:1180px;margin:0 auto;padding:0 20px}
header.top h1{margin:0;font-size:20px;font-weight:650;letter-spacing:.2px}
header.top .sub{color:#d1d5db;margin-top:3px;font-size:13px}
header.top .status{float:right;margin-top:2px}
nav.toc{font-size:12.5px;margin-top:8px}nav.toc a{color:#93c5fd;margin-right:14px;text-decoration:none}
section{background:var(--panel);border:1px solid var(--line);border-radius:8px;padding:14px 18px 16px;
margin:0 0 16px}
section>h2{font-size:15.5px;margin:0 0 10px;font-weight:650}
h3{font-size:13.5px;margin:14px 0 6px;font-weight:600}
p{margin:6px 0}.muted{color:var(--muted)}.small{font-size:12.5px}
code,.mono{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.5px}
dl.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:4px 18px;margin:0}
dl.facts div.wide{grid-column:span 2}
dl.facts div{display:flex;gap:8px;border-bottom:1px dashed var(--line);padding:3px 0}
dl.facts dt{color:var(--muted);min-width:98px}dl.facts dd{margin:0;font-weight:550}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(330px,1fr));gap:12px}
.card{border:1px solid var(--line);border-left:5px solid var(--na);border-radius:6px;padding:10px 12px;
background:#fff;min-width:0;container-type:inline-size;overflow-wrap:break-word}
.card.ok{border-left-color:var(--ok)}.card.warn{border-left-color:#d97706}.card.bad{border-left-color:var(--bad)}
.card h3{margin:0 0 6px;display:flex;align-items:center;gap:8px;font-size:15px}
.badge{display:inline-block;border-radius:999px;padding:1px 9px;font-size:12px;font-weight:650;white-space:nowrap;
border:1px solid transparent}
.badge.ok{background:var(--okbg);color:var(--ok);border-color:#6ee7b7}
.badge.warn{background:var(--warnbg);color:var(--warn);border-color:#fcd34d}
.badge.bad{background:var(--badbg);color:var(--bad);border-color:#fca5a5}
.badge.na{background:var(--nabg);color:var(--na);border-color:#d1d5db}
.diag{background:#f9fafb;border:1px solid var(--line);border-radius:5px;padding:6px 9px;margin-top:6px;font-size:12.8px}
.diag{overflow-wrap:break-word}.diag b{font-weight:600}.fix{color:var(--ok)}
.nm{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.3px;
overflow-wrap:normal}
.causes{margin-top:8px}table.causes{margin:4px 0 0;font-size:12.8px}table.causes td{overflow-wrap:normal}
.causes .rn{display:block}
@container (width >= 760px){table.causes td.c-rule{width:15%}table.causes td.c-module{width:20%}
 table.causes td.c-at{width:25%}table.causes td.c-evidence{min-width:14em}}
table.causes .ev,table.causes .fix{overflow-wrap:break-word}
.tag{display:inline-block;font-size:11px;font-weight:650;color:var(--bad);background:var(--badbg);
border:1px solid #fca5a5;border-radius:4px;padding:0 4px;line-height:1.4}
.fold{font-size:11.5px;color:var(--warn);font-weight:600}.fold b{white-space:nowrap;font-weight:650}.fold i{white-space:nowrap;font-style:normal}
.also{font-size:11.5px;color:var(--muted)}
@container (width < 760px){
 table.causes thead{display:none}
 table.causes,table.causes tbody,table.causes tr,table.causes td{display:block}
 table.causes tr{border-bottom:1px solid var(--line);padding:5px 8px}table.causes tr.hl{background:#fff7ed}
 table.causes td{border:0;padding:1px 0}table.causes td.none{display:none}.causes .rn{display:inline}
 table.causes td.c-module::before,table.causes td.c-at::before{content:attr(data-label);color:var(--muted);
 font-weight:600;margin-right:6px}
}
ul.notes{margin:6px 0 0;padding-left:18px;color:#374151;font-size:12.8px}
.tiles{display:flex;flex-wrap:wrap;gap:10px;margin:4px 0 10px}
.tile{border:1px solid var(--line);border-radius:6px;padding:7px 12px;min-width:150px;background:#fafafa}
.tile .k{color:var(--muted);font-size:12px}.tile .v{font-size:18px;font-weight:650}
.tile.bad{border-color:#fca5a5;background:var(--badbg)}.tile.ok .v{color:var(--ok)}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:8px 20px}
figure{margin:6px 0 8px}figcaption{font-size:12.5px;color:var(--muted);margin:2px 0 4px;font-weight:550}
figcaption .why{display:block;font-weight:400;font-size:12px;color:#4b5563}
table{border-collapse:collapse;margin:6px 0;width:100%;font-size:13px}
th{text-align:left;color:var(--muted);font-weight:600;border-bottom:2px solid var(--line);padding:4px 8px}
td{border-bottom:1px solid var(--line);padding:4px 8px;vertical-align:top}
td.w{overflow-wrap:anywhere}
table.compact{width:auto;min-width:420px}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}td.n{white-space:nowrap}
tr.hl td{background:#fff7ed}
.chart-empty{border:1px dashed #d1d5db;border-radius:6px;padding:28px 12px;text-align:center;color:var(--muted);
margin:4px 0}.chart-empty.equal{border-color:#6ee7b7;background:#f0fdf4;color:var(--ok);font-weight:600}
svg.chart{width:100%;height:auto;display:block}
svg.chart.heat{width:100%}
svg text{font-size:11px;fill:#374151;font-family:system-ui,"DejaVu Sans",sans-serif}
svg text.axis{fill:var(--muted)}svg text.glabel{font-size:11.5px;fill:#111827}
svg text.val{font-size:10.5px;fill:#111827}svg text.cell{font-size:10.5px;fill:#111827}
svg text.cell.dark{fill:#fff}
svg line.grid{stroke:#eef0f3}svg line.zero{stroke:#9ca3af;stroke-dasharray:3 3}
svg polyline.line{fill:none;stroke-width:2;stroke-linejoin:round}
footer{color:var(--muted);font-size:12px;margin:18px 0}
@media print{
 body{background:#fff;font-size:11.5px}header.top{background:#fff;color:#000;border-bottom:2px solid #000;padding:4px 0}
 header.top .sub{color:#333}nav.toc{display:none}main,header.top .in{max-width:none;padding:0}
 section{border:none;border-top:1px solid #999;border-radius:0;padding:8px 0;break-inside:auto}
 figure,.card,table,.tiles{break-inside:avoid}h2,h3{break-after:avoid}
 *{-webkit-print-color-adjust:exact;print-color-adjust:exact}
 .grid2{grid-template-columns:1fr 1fr}.cards{grid-template-columns:1fr 1fr}
}
"""

_VERDICT_CLASS = {"match": "ok", "ok": "ok", "rng-divergence": "warn", "unavailable": "na", "skipped": "na",
                  "stopped": "na", "environment-failed": "na"}
"""Badge class by verdict; an environment failure is grey like `unavailable`: it says nothing of the model."""
_VERDICT_MARK = {"ok": "\u2713", "warn": "\u2248", "bad": "\u2717", "na": "\u2013"}


def stopped_badge(signal_name: str, exit_code: int | None, what: str) -> str:
    """The page's overall badge of a partial report: graphdoctor was stopped by `signal_name` (neither pass
    nor fail: what ran is shown, what did not is not judged)."""
    code = f" (exit {exit_code})" if exit_code is not None else ""
    return (f'<span class="badge na" id="overall" data-verdict="stopped">{_VERDICT_MARK["na"]} STOPPED by '
            f"{escape(signal_name)}{code}: partial report, {escape(what)}</span>")


def verdict_class(verdict: str) -> str:
    """CSS class of a verdict: ok, warn (passes with a caveat), bad or na."""
    return _VERDICT_CLASS.get(verdict, "bad")


def badge(verdict: str, *, extra: str = "") -> str:
    """A verdict badge: colour plus a mark and the verdict word, so it reads without colour."""
    cls = verdict_class(verdict)
    text = f"{_VERDICT_MARK[cls]} {verdict}" + (f" \u00b7 {extra}" if extra else "")
    return f'<span class="badge {cls}" data-verdict="{escape(verdict)}">{escape(text)}</span>'


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, numeric: Sequence[int] = (),
          highlight: Sequence[int] = (), wrap: Sequence[int] = (), cls: str = "") -> str:
    """An escaped HTML table.

    Args:
        headers: column headers.
        rows: cell values (str() of each is escaped).
        numeric: column indexes right-aligned with tabular digits.
        highlight: row indexes tinted.
        wrap: column indexes whose long names (paths, modules) may break anywhere to fit the page.
        cls: CSS class of the table.

    Returns:
        The <table> element.
    """
    classes = {i: "n" for i in numeric} | {i: "w" for i in wrap}
    head = "".join(f'<th{f" class={classes[i]}" if i in classes else ""}>{escape(h)}</th>'
                   for i, h in enumerate(headers))
    body = []
    for r, row in enumerate(rows):
        cells = "".join(f'<td{f" class={classes[i]}" if i in classes else ""}>{escape(str(c))}</td>'
                        for i, c in enumerate(row))
        body.append(f'<tr{" class=hl" if r in highlight else ""}>{cells}</tr>')
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def tile(key: str, value: str, *, state: str = "") -> str:
    """A key figure: small caption over a large value; state "bad" or "ok" tints it."""
    return f'<div class="tile {state}"><div class="k">{escape(key)}</div><div class="v">{escape(value)}</div></div>'


def figure(caption: str, svg: str, *, note: str = "", data: Mapping[str, str] | None = None) -> str:
    """A captioned chart.

    Args:
        caption: what the chart shows.
        svg: the chart (already HTML).
        note: a second caption line saying how the values were obtained (optional).
        data: data-* attributes of the figure, for the browser tests and for styling.

    Returns:
        The <figure> element.
    """
    attrs = "".join(f' data-{escape(k)}="{escape(v)}"' for k, v in (data or {}).items())
    why = f'<span class="why">{escape(note)}</span>' if note else ""
    return f"<figure{attrs}><figcaption>{escape(caption)}{why}</figcaption>{svg}</figure>"


def page(*, title: str, heading: str, subtitle: str, status_html: str, toc: Sequence[tuple[str, str]],
         body: str, footer: str) -> str:
    """The whole self-contained document: inline stylesheet, no script, no external resource.

    Args:
        title: the <title>.
        heading: the page heading.
        subtitle: one line under the heading.
        status_html: badge(s) shown at the right of the heading (already HTML).
        toc: (anchor id, label) links to the sections.
        body: the sections (already HTML).
        footer: footer text.

    Returns:
        The HTML document.
    """
    links = "".join(f'<a href="#{escape(anchor)}">{escape(label)}</a>' for anchor, label in toc)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            f'<header class="top"><div class="in"><div class="status">{status_html}</div>'
            f"<h1>{escape(heading)}</h1><div class=\"sub\">{escape(subtitle)}</div>"
            f'<nav class="toc">{links}</nav></div></header><main>{body}'
            f"<footer>{escape(footer)}</footer></main></body></html>\n")


__all__ = ["CSS", "badge", "figure", "page", "stopped_badge", "table", "tile", "verdict_class"]
