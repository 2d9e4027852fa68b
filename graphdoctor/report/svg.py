"""Inline SVG charts for graphdoctor's HTML pages: line chart (linear or log scale), bar chart, heat strip.

Pure string building, no JavaScript, no network: every chart is one <svg> element sized by its
viewBox, styled by the shared stylesheet (html_page.CSS), and readable without colour (each series
also has its own dash pattern and marker shape; heat cells carry their value as text).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#2563eb", "#ea580c", "#059669", "#9333ea", "#db2777", "#0891b2", "#ca8a04", "#64748b")
"""Series colours (colour-blind friendly order); eager is drawn in EAGER_COLOUR."""

EAGER_COLOUR = "#1f2937"
_DASHES = ("", "6 3", "2 3", "8 3 2 3", "4 2", "1 2")
_MARKERS = ("circle", "square", "triangle", "diamond")

Formatter = Callable[[float], str]


@dataclass(frozen=True, slots=True)
class Series:
    """One line (or one bar per group) of a chart."""

    name: str
    values: tuple[float | None, ...]
    """One value per x position (None: no value, a gap)."""

    colour: str
    dash: str = ""
    marker: str = "circle"


def series_style(index: int) -> tuple[str, str, str]:
    """(colour, dash, marker) of the index-th non-eager series."""
    return (PALETTE[index % len(PALETTE)], _DASHES[(index + 1) % len(_DASHES)],
            _MARKERS[(index + 1) % len(_MARKERS)])


def fmt_num(value: float) -> str:
    """Short label, 3 significant digits: 0.0489, 7.04, 1234, 2.41e7, 1e-4."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        mantissa, exponent = f"{value:.2e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _nice_ticks(low: float, high: float, num: int = 5, min_step: float = 0.0) -> list[float]:
    if not high > low:
        high = low + 1.0
    raw = max((high - low) / num, min_step)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(low / step) * step
    ticks, value = [], first
    while value < high + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _marker(shape: str, x: float, y: float, colour: str, hollow: bool = False) -> str:
    fill = "#fff" if hollow else colour
    common = f'fill="{fill}" stroke="{colour}" stroke-width="1.4"'
    if shape == "square":
        return f'<rect x="{x - 3.2:.1f}" y="{y - 3.2:.1f}" width="6.4" height="6.4" {common}/>'
    if shape == "triangle":
        return f'<path d="M{x:.1f} {y - 4:.1f}L{x + 3.8:.1f} {y + 3:.1f}H{x - 3.8:.1f}Z" {common}/>'
    if shape == "diamond":
        return f'<path d="M{x:.1f} {y - 4.2:.1f}L{x + 4.2:.1f} {y:.1f}L{x:.1f} {y + 4.2:.1f}L{x - 4.2:.1f} {y:.1f}Z" {common}/>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.2" {common}/>'


def _legend(series: Sequence[Series], width: int) -> tuple[str, int]:
    """Legend rows above the plot; returns (svg, height used)."""
    parts, x, y = [], 8.0, 14
    for s in series:
        item_w = 44 + 6.6 * len(s.name)
        if x + item_w > width and x > 8:
            x, y = 8.0, y + 18
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        parts.append(f'<line x1="{x:.1f}" x2="{x + 26:.1f}" y1="{y - 4}" y2="{y - 4}" stroke="{s.colour}" '
                     f'stroke-width="2"{dash}/>' + _marker(s.marker, x + 13, y - 4, s.colour)
                     + f'<text x="{x + 32:.1f}" y="{y}">{escape(s.name)}</text>')
        x += item_w
    return "".join(parts), y + 10


def line_chart(series: Sequence[Series], x_values: Sequence[int | float], *, title: str, log_y: bool = False,
               y_format: Formatter = fmt_num, x_label: str = "step", width: int = 560, height: int = 250,
               point_titles: Sequence[str] | None = None, counts: bool = False) -> str:
    """A line chart with a legend; on a log scale zeros are drawn on a separate "0 (equal)" band.

    Args:
        series: the lines; each has one value per entry of x_values.
        x_values: x position of every value (steps).
        title: accessible name of the chart (aria-label).
        log_y: log10 y axis (non-positive values go to the "equal" band).
        y_format: tick label formatter.
        x_label: x axis caption.
        width: viewBox width.
        height: viewBox height of the plot area (the legend adds to it).
        point_titles: hover text per x position (optional).
        counts: the values are counts: a linear axis from 0 with whole-number ticks (log_y is ignored).

    Returns:
        The <svg> element, or a muted paragraph when there is nothing to plot.
    """
    log_y = log_y and not counts
    finite = [v for s in series for v in s.values if v is not None and math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if not x_values or not finite or (log_y and not positive):
        if finite:
            return ('<div class="chart-empty equal" role="img" aria-label="' + escape(title) + '">\u2713 every value '
                    "is 0: bitwise equal at every step</div>")
        return f'<div class="chart-empty" role="img" aria-label="{escape(title)}">no values recorded</div>'
    legend, top = _legend(series, width)
    left, right, bottom = 62, 14, 34
    zero_band = log_y and any(v <= 0 for v in finite)
    plot_h = height - bottom - 8 - (26 if zero_band else 0)
    x_lo, x_hi = min(x_values), max(x_values)
    x_span = (x_hi - x_lo) or 1

    def px(x: float) -> float:
        return left + (x - x_lo) / x_span * (width - left - right)

    # A count axis starts at 0 and spans at least one, so a single differing tensor reads as 1 of 0..1.
    scale_values = [0.0, 1.0, *finite] if counts else finite
    ticks, py = _y_scale(scale_values, log_y, top, plot_h, min_step=1.0 if counts else 0.0)
    zero_y = top + plot_h + 22
    total_h = top + plot_h + bottom + (26 if zero_band else 0)
    parts = [f'<svg class="chart" viewBox="0 0 {width} {total_h}" role="img" aria-label="{escape(title)}">', legend]
    for tick in ticks:
        y = py(tick)
        parts.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{y_format(tick)}</text>')
    if zero_band:
        parts.append(f'<line class="zero" x1="{left}" x2="{width - right}" y1="{zero_y}" y2="{zero_y}"/>'
                     f'<text class="tick" x="{left - 6}" y="{zero_y + 4}" text-anchor="end">0 (equal)</text>')
    axis_y = total_h - bottom + 6
    label_every = max(1, math.ceil(len(x_values) / 16))
    for i, x in enumerate(x_values):
        if i % label_every == 0:
            parts.append(f'<text class="tick" x="{px(x):.1f}" y="{axis_y + 10}" text-anchor="middle">{x:g}</text>')
    parts.append(f'<text class="axis" x="{(left + width - right) / 2:.0f}" y="{total_h - 2}" '
                 f'text-anchor="middle">{escape(x_label)}</text>')
    for s in series:
        parts.append(_polyline(s, x_values, px, py, zero_y if zero_band else None, log_y, point_titles))
    parts.append("</svg>")
    return "".join(parts)


def _y_scale(finite: Sequence[float], log_y: bool, top: float, plot_h: float,
             min_step: float = 0.0) -> tuple[list[float], Callable[[float], float]]:
    """Tick values and the value -> y pixel map (log: whole decades over the positive values; linear:
    ticks at least min_step apart)."""
    if log_y:
        positive = [v for v in finite if v > 0]
        lo_dec, hi_dec = math.floor(math.log10(min(positive))), math.ceil(math.log10(max(positive)))
        hi_dec = max(hi_dec, lo_dec + 1)
        step = max(1, math.ceil((hi_dec - lo_dec) / 6))
        ticks = [10.0 ** d for d in range(lo_dec, hi_dec + 1, step)]
        lo_t, hi_t = math.log10(ticks[0]), math.log10(ticks[-1])

        def log_py(v: float) -> float:
            return top + plot_h - (math.log10(v) - lo_t) / ((hi_t - lo_t) or 1) * plot_h

        return ticks, log_py
    ticks = _nice_ticks(min(finite), max(finite), min_step=min_step)

    def lin_py(v: float) -> float:
        return top + plot_h - (v - ticks[0]) / ((ticks[-1] - ticks[0]) or 1) * plot_h

    return ticks, lin_py


def _polyline(s: Series, x_values: Sequence[int | float], px: Callable[[float], float],
              py: Callable[[float], float], zero_y: float | None, log_y: bool,
              point_titles: Sequence[str] | None) -> str:
    points: list[tuple[float, float, bool, float]] = []
    for x, v in zip(x_values, s.values, strict=False):
        if v is None or not math.isfinite(v):
            points.append((px(x), math.nan, False, math.nan))
        elif log_y and v <= 0:
            points.append((px(x), zero_y if zero_y is not None else math.nan, True, v))
        else:
            points.append((px(x), py(v), False, v))
    dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
    runs: list[list[str]] = []
    current: list[str] = []
    for x, y, _, _ in points:
        if math.isnan(y):
            runs.append(current)
            current = []
        else:
            current.append(f"{x:.1f},{y:.1f}")
    runs.append(current)
    out = [f'<polyline class="line" points="{" ".join(r)}" stroke="{s.colour}"{dash}/>' for r in runs if len(r) > 1]
    for i, (x, y, is_zero, v) in enumerate(points):
        if math.isnan(y):
            continue
        tip = f"{s.name}: {fmt_num(v)}"
        if point_titles and i < len(point_titles):
            tip = f"{point_titles[i]} {tip}"
        out.append(f"<g>{_marker(s.marker, x, y, s.colour, hollow=is_zero)}<title>{escape(tip)}</title></g>")
    return "".join(out)


def bar_chart(groups: Sequence[str], series: Sequence[Series], *, title: str, value_format: Formatter = fmt_num,
              width: int = 560, label_width: int = 190) -> str:
    """Horizontal grouped bars: one group per label, one bar per series, the value printed at its end.

    Args:
        groups: group labels, top to bottom.
        series: bars; series.values has one value per group (None: no bar, printed as "n/a").
        title: accessible name of the chart.
        value_format: formatter of the printed values.
        width: viewBox width.
        label_width: room for the group labels on the left.

    Returns:
        The <svg> element.
    """
    legend, top = _legend(series, width) if len(series) > 1 else ("", 4)
    bar_h, gap = 13, 10
    group_h = bar_h * len(series) + gap
    top_value = max((v for s in series for v in s.values if v is not None and math.isfinite(v)), default=0.0)
    scale = (width - label_width - 78) / (top_value or 1)
    height = top + group_h * len(groups) + 4
    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">', legend]
    for g, label in enumerate(groups):
        y0 = top + g * group_h
        parts.append(f'<text class="glabel" x="{label_width - 8}" y="{y0 + group_h / 2 - 1:.1f}" '
                     f'text-anchor="end">{escape(label)}</text>')
        for k, s in enumerate(series):
            value = s.values[g] if g < len(s.values) else None
            y = y0 + k * bar_h
            if value is None or not math.isfinite(value):
                parts.append(f'<text class="tick" x="{label_width + 4}" y="{y + 10}">n/a</text>')
                continue
            w = max(value * scale, 1.0 if value else 0.0)
            parts.append(f'<g><rect x="{label_width}" y="{y}" width="{w:.1f}" height="{bar_h - 2}" '
                         f'fill="{s.colour}"/><title>{escape(f"{label}, {s.name}: {value_format(value)}")}</title></g>'
                         f'<text class="val" x="{label_width + w + 4:.1f}" y="{y + 10}">{value_format(value)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def byte_ticks(top: float, num: int = 5) -> list[float]:
    """Axis ticks for byte counts: multiples of a power of two (1, 2, 4 or 8 times 2**k), from 0 past top."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / num
    mag = 1 << max(0, int(raw).bit_length() - 1)
    step = next(m * mag for m in (1, 2, 4, 8) if m * mag >= raw)
    return [float(v) for v in range(0, int(top) + step + 1, step) if v < top + step]


def _runs(label_index: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) index ranges of consecutive points with the same label."""
    runs, start = [], 0
    for i in range(1, len(label_index) + 1):
        if i == len(label_index) or label_index[i] != label_index[start]:
            runs.append((start, i))
            start = i
    return runs


def _phase_mark(name: str, x0: float, x1: float, top: float, plot_h: float, *, first: bool) -> str:
    """A dashed boundary where a label run starts, and its name above the plot when it fits."""
    out = "" if first else f'<line class="zero" x1="{x0:.1f}" x2="{x0:.1f}" y1="{top - 14}" y2="{top + plot_h}"/>'
    if x1 - x0 > 7 * len(name) + 8:
        out += f'<text class="axis" x="{(x0 + x1) / 2:.1f}" y="{top - 4}" text-anchor="middle">{escape(name)}</text>'
    return out


def timeline_chart(x_values: Sequence[int], y_values: Sequence[float], label_index: Sequence[int],
                   labels: Sequence[str], *, title: str, y_format: Formatter = fmt_num, x_label: str = "",
                   byte_axis: bool = False, width: int = 1080, height: int = 300) -> str:
    """A dense line without markers, coloured by the label of each point (phases of a memory history).

    A track above the plot names each label run wide enough to hold its name, and dashed lines mark
    every change, so the phases read without colour.

    Args:
        x_values: x of every point (event index), increasing.
        y_values: y of every point.
        label_index: per point, an index into labels.
        labels: legend names.
        title: accessible name.
        y_format: tick label formatter.
        x_label: x axis caption.
        byte_axis: y ticks at multiples of powers of two (byte counts).
        width: viewBox width.
        height: viewBox height of the plot area.

    Returns:
        The <svg> element.
    """
    series = [Series(name, (), PALETTE[i % len(PALETTE)]) for i, name in enumerate(labels)]
    legend, top = _legend(series, width)
    top += 16  # the phase track
    left, right, bottom = 78, 14, 30
    plot_h = height - bottom - 8
    y_top = max(max(y_values, default=0.0), 1.0)
    ticks = byte_ticks(y_top) if byte_axis else _nice_ticks(0.0, y_top)
    x_lo, x_hi = (x_values[0], x_values[-1]) if x_values else (0, 1)

    def px(i: int) -> float:
        return left + (x_values[i] - x_lo) / ((x_hi - x_lo) or 1) * (width - left - right)

    def xy(i: int) -> str:
        return f"{px(i):.1f},{top + plot_h - y_values[i] / (ticks[-1] or 1) * plot_h:.1f}"

    total_h = top + plot_h + bottom
    parts = [f'<svg class="chart" viewBox="0 0 {width} {total_h}" role="img" aria-label="{escape(title)}">', legend]
    for tick in ticks:
        y = top + plot_h - tick / (ticks[-1] or 1) * plot_h
        parts.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{y_format(tick)}</text>')
    for start, end in _runs(label_index):
        name = labels[label_index[start]]
        parts.append(_phase_mark(name, px(start), px(min(end, len(x_values) - 1)), top, plot_h, first=not start))
        # Each run extends to the next point so the line stays continuous across colours.
        points = " ".join(xy(j) for j in range(start, min(end + 1, len(x_values))))
        colour = PALETTE[label_index[start] % len(PALETTE)]
        parts.append(f'<polyline class="line" stroke="{colour}" points="{points}"><title>{escape(name)}</title>'
                     "</polyline>")
    parts.append(f'<text class="tick" x="{left}" y="{total_h - 4}">{x_lo:g}</text>'
                 f'<text class="tick" x="{width - right}" y="{total_h - 4}" text-anchor="end">{x_hi:g}</text>'
                 f'<text class="axis" x="{(left + width - right) / 2:.0f}" y="{total_h - 4}" text-anchor="middle">'
                 f"{escape(x_label)}</text></svg>")
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class HeatCell:
    """One cell of a heat strip: its printed text, intensity in [0, 1] (None: not compared) and hover text."""

    text: str
    level: float | None
    title: str


def heat_colour(level: float | None) -> str:
    """White-green for 0, then amber to dark red with the level; grey for not compared."""
    if level is None:
        return "#e5e7eb"
    if level <= 0:
        return "#dcfce7"
    stops = ((254, 243, 199), (251, 146, 60), (185, 28, 28))
    t = min(max(level, 0.0), 1.0) * 2
    a, b = (stops[0], stops[1]) if t <= 1 else (stops[1], stops[2])
    t = t if t <= 1 else t - 1
    r, g, bl = (round(a[i] + (b[i] - a[i]) * t) for i in range(3))
    return f"#{r:02x}{g:02x}{bl:02x}"


CHAR_W = 6.5
"""Width of one character of the charts' 10.5 px tick and cell text, in viewBox units (a digit is about 6 px)."""

HEADER_STRIDES = (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100)
"""Column-header strides a narrow heat strip may write every n-th header at (powers of two for expert numbers,
round numbers for steps)."""


def _header_stride(columns: Sequence[str], cell_w: float) -> int:
    """The smallest stride at which the written headers do not overlap."""
    need = CHAR_W * max((len(c) for c in columns), default=1) + 4
    return next((s for s in HEADER_STRIDES if s * cell_w >= need), HEADER_STRIDES[-1])


def heat_strip(rows: Sequence[tuple[str, Sequence[HeatCell]]], columns: Sequence[str], *, title: str,
               width: int = 1080, label_width: int = 230, axis: str = "step") -> str:
    """Rows of coloured cells (one column per step, or per `axis`) with their value written inside.

    Where the columns are too many for their text (a MoE layer's 64 or 256 experts, a long run's steps), the cells
    keep their colour and hover and drop the written value, and only every n-th column header is written (n from
    HEADER_STRIDES), so no text overlaps; the hover then names its column, unless its text does already.

    Args:
        rows: (row label, cells) pairs; every row has one cell per column.
        columns: column headers (step numbers).
        title: accessible name.
        axis: what the columns are, written left of their headers.
        width: viewBox width.
        label_width: room for the row labels.

    Returns:
        The <svg> element.
    """
    cell_w = min(64.0, (width - label_width - 8) / max(len(columns), 1))
    cell_h, head = 22, 18
    height = head + cell_h * len(rows) + 4
    used_w = label_width + cell_w * len(columns) + 8
    stride = _header_stride(columns, cell_w)
    widest = max((len(cell.text) for _, cells in rows for cell in cells), default=0)
    write_values = cell_w >= CHAR_W * widest + 4
    parts = [f'<svg class="chart heat" viewBox="0 0 {used_w:.0f} {height}" role="img" aria-label="{escape(title)}"'
             f' style="max-width:{used_w:.0f}px">']
    parts.append(f'<text class="tick" x="{label_width - 8}" y="12" text-anchor="end">{escape(axis)}</text>')
    for c, name in enumerate(columns):
        if c % stride:
            continue
        parts.append(f'<text class="tick" x="{label_width + c * cell_w + cell_w / 2:.1f}" y="12" '
                     f'text-anchor="middle">{escape(name)}</text>')
    for r, (label, cells) in enumerate(rows):
        y = head + r * cell_h
        parts.append(f'<text class="glabel" x="{label_width - 8}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
        for c, cell in enumerate(cells):
            x = label_width + c * cell_w
            dark = cell.level is not None and cell.level > 0.55
            value = (f'<text class="cell{" dark" if dark else ""}" x="{x + cell_w / 2:.1f}" y="{y + 15}" '
                     f'text-anchor="middle">{escape(cell.text)}</text>') if write_values else ""
            named = re.search(rf"\b{re.escape(axis)} {re.escape(columns[c])}\b", cell.title)
            hover = cell.title if write_values or named else f"{axis} {columns[c]}: {cell.title}"
            parts.append(f'<g><rect x="{x + 1:.1f}" y="{y + 1}" width="{max(cell_w - 2, 1):.1f}" '
                         f'height="{cell_h - 2}" rx="{2 if cell_w > 8 else 0}" fill="{heat_colour(cell.level)}"/>'
                         f"{value}<title>{escape(hover)}</title></g>")
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["EAGER_COLOUR", "PALETTE", "HeatCell", "Series", "bar_chart", "byte_ticks", "fmt_num", "heat_colour", "heat_strip",
           "line_chart", "series_style", "timeline_chart"]
