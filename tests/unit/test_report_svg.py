"""Inline SVG charts shared by the diff and triage pages: scales, empty states, colour-free cues."""

from __future__ import annotations

import re

from graphdoctor.report.svg import (
    HeatCell,
    Series,
    bar_chart,
    byte_ticks,
    fmt_num,
    heat_colour,
    heat_strip,
    line_chart,
    series_style,
)


def test_fmt_num_keeps_three_significant_digits() -> None:
    assert [fmt_num(v) for v in (0.0, 0.0489, 7.04, 1234.5, 2.41e7, 1e-4, 1e4)] == [
        "0", "0.0489", "7.04", "1234", "2.41e7", "1e-4", "1e4"]


def test_log_chart_puts_zeros_on_the_equal_band_with_hollow_markers() -> None:
    series = [Series("local", (0.0, 0.0489, 0.0225), "#123456"), Series("full", (0.0, 0.0, 0.0), "#654321")]
    svg = line_chart(series, [0, 1, 2], title="grads", log_y=True)
    assert "0 (equal)" in svg
    assert svg.count('fill="#fff"') == 4  # four zeros drawn hollow
    assert re.findall(r'>(0\.01|0\.1)</text>', svg) == ["0.01", "0.1"]  # whole decades around the values


def test_all_zero_log_chart_is_an_equal_state_not_an_empty_axis() -> None:
    svg = line_chart([Series("a", (0.0, 0.0), "#000")], [0, 1], title="t", log_y=True)
    assert "<svg" not in svg and "bitwise equal" in svg
    assert "no values recorded" in line_chart([Series("a", (None, None), "#000")], [0, 1], title="t")


def test_series_differ_by_dash_and_marker_not_only_colour() -> None:
    styles = [series_style(i) for i in range(3)]
    assert len({(dash, marker) for _, dash, marker in styles}) == 3


def test_bar_chart_prints_values_and_marks_missing() -> None:
    svg = bar_chart(["host launches", "graph launches"], [Series("eager", (658.0, None), "#000")], title="b",
                    value_format=lambda v: f"{v:.0f}")
    assert ">658<" in svg and ">n/a<" in svg


def test_heat_strip_writes_values_and_scales_colour() -> None:
    svg = heat_strip([("local grads", [HeatCell("=", 0.0, "equal"), HeatCell("53", 1.0, "all")])], ["0", "1"],
                     title="h")
    assert ">=<" in svg and ">53<" in svg and heat_colour(1.0) == "#b91c1c" and heat_colour(None) == "#e5e7eb"


def test_a_strip_of_256_experts_keeps_colour_and_hover_and_writes_no_overlapping_text() -> None:
    cells = [HeatCell("=", 0.0, "equal") for _ in range(255)] + [HeatCell("3", 1.0, "main_grads at step 3")]
    svg = heat_strip([("decoder.layers.0.mlp", cells)], [str(e) for e in range(256)], title="experts", axis="expert")
    assert svg.count("<rect") == 256 and heat_colour(1.0) in svg  # every expert keeps its cell and colour
    assert 'class="cell' not in svg  # 3.3 px cells: no value written inside
    assert "<title>expert 255: main_grads at step 3</title>" in svg  # the hover names the column
    named = [HeatCell("=", 0.0, f"decoder.layers.0.mlp expert {e}: equal") for e in range(256)]
    svg = heat_strip([("decoder.layers.0.mlp", named)], [str(e) for e in range(256)], title="experts", axis="expert")
    assert "<title>decoder.layers.0.mlp expert 25: equal</title>" in svg  # named by its text: not again
    assert "<title>expert 2: decoder.layers.0.mlp expert 25" not in svg
    heads = [(float(x), name) for x, name in re.findall(r'class="tick" x="([\d.]+)" y="12" text-anchor="middle">(\d+)<', svg)]
    assert [name for _, name in heads] == [str(e) for e in range(0, 256, 8)]
    gaps = [b[0] - a[0] for a, b in zip(heads, heads[1:], strict=False)]
    assert min(gaps) >= 3 * 6.5 + 4  # three-digit headers never overlap


def test_a_strip_of_eight_steps_writes_every_value_and_header() -> None:
    cells = [HeatCell(str(n), n / 8, f"{n} tensors") for n in range(8)]
    svg = heat_strip([("local grads", cells)], [str(s) for s in range(1, 9)], title="steps")
    assert re.findall(r'class="cell[^"]*"[^>]*>(\d+)<', svg) == [str(n) for n in range(8)]
    assert len(re.findall(r'y="12" text-anchor="middle">', svg)) == 8
    assert "<title>3 tensors</title>" in svg


def test_byte_ticks_are_powers_of_two_multiples() -> None:
    ticks = byte_ticks(238.4 * 2**20)
    assert ticks[0] == 0 and ticks[-1] >= 238.4 * 2**20
    step = ticks[1] - ticks[0]
    assert step == 64 * 2**20 and all(b - a == step for a, b in zip(ticks, ticks[1:], strict=False))
