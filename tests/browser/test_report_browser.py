"""Every HTML page rendered from the recorded H200 reports, loaded in headless Chromium from file://:
no JavaScript error, no request leaves the file, the key elements are in the DOM after scripts run,
the screenshot is not blank and the page prints. Skips (with the reason) where Chromium is missing;
.ci/run installs chromium-headless-shell and sets GRAPHDOCTOR_REQUIRE_BROWSER, so in CI they run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chromium import Browser, Page
from png import decode

from graphdoctor.memory.analysis import triage
from graphdoctor.memory.loader import save_snapshot
from graphdoctor.memory.synthetic import graphed_run
from graphdoctor.report.html import render_file
from graphdoctor.report.memory_html import render_html

pytestmark = pytest.mark.browser

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "data"
PAGES = sorted((FIXTURES / "diff").glob("*.json")) + sorted((FIXTURES / "forensics").glob("*.json.gz"))
MIN_COLOURS = 12
"""A rendered report has text, badges and chart colours: far more than a blank or error page."""


@pytest.fixture(scope="module")
def page(browser: Browser) -> Page:
    return Page(browser)


def _check_loaded(page: Page, html: Path) -> None:
    page.load(html.resolve().as_uri())
    assert page.errors() == []
    foreign = [url for url in page.requests() if not url.startswith(("file:", "data:", "about:"))]
    assert foreign == []


def _check_screenshot(page: Page, out: Path) -> None:
    png = page.screenshot()
    out.write_bytes(png)
    image = decode(png)
    assert (image.width, image.height) == (1280, 900)
    assert len(image.colours(step=2)) >= MIN_COLOURS
    background = image.pixel(5, 890)
    rows = image.rows[::6]
    num_other = sum(row[i:i + image.channels] != bytes(background)
                    for row in rows for i in range(0, len(row), image.channels * 6))
    assert num_other > 0.05 * (len(rows) * image.width // 6)


def _compared_families(report: Path) -> set[str]:
    """The tensor families (grads, params) some run of the report compared at some step."""
    data = json.loads(report.read_text(encoding="utf-8"))
    return {family for impl in data.get("impls", []) for run in impl.get("runs", []) for step in run.get("steps", [])
            for family in ("grads", "params") if step.get(family)}


@pytest.mark.parametrize("report", PAGES, ids=lambda p: p.name)
def test_report_page_in_chromium(page: Page, report: Path, tmp_path: Path) -> None:
    html = render_file(report, tmp_path / "report.html")
    _check_loaded(page, html)
    dom = page.evaluate("""JSON.stringify({
        badges: [...document.querySelectorAll('.card .badge')].map(b => b.dataset.verdict),
        impls: [...document.querySelectorAll('.card[data-impl]')].map(c => c.dataset.impl),
        overall: !!document.getElementById('overall'),
        loss_charts: [...document.querySelectorAll('#loss figure')].filter(f => f.querySelector(
            'svg.chart polyline, .chart-empty')).length,
        numeric_charts: [...document.querySelectorAll('#numeric figure[data-family]')].filter(f => f.querySelector(
            'svg.chart, .chart-empty')).map(f => `${f.dataset.family} ${f.dataset.plot}`),
        heat: !!document.querySelector('#numeric svg.chart.heat'),
        memory: !!document.getElementById('memory'), launches: !!document.getElementById('launches'),
        forensics_rows: document.querySelectorAll('#forensics tbody tr').length,
        width: document.documentElement.scrollWidth})""")
    found = json.loads(dom)
    payload_impls = [i for i in _impl_names(report)]
    assert found["impls"] == payload_impls and found["overall"]
    assert all(v and v != "?" for v in found["badges"]) and len(found["badges"]) >= len(payload_impls)
    assert found["width"] <= 1280  # nothing overflows the viewport sideways
    if report.suffix == ".json":
        assert found["loss_charts"] >= 2 and found["memory"] and found["launches"]
        # Per compared family: max abs and max rel where magnitudes were measured (or every tensor is
        # equal), else one chart of the number of differing tensors; and the heat strip.
        charts = found["numeric_charts"]
        for family in _compared_families(report):
            mine = sorted(c.split()[1] for c in charts if c.split()[0] == family)
            assert mine in (["max_abs", "max_rel"], ["count"]), (family, charts)
        assert found["heat"] or not _compared_families(report)
    _check_screenshot(page, tmp_path / "shot.png")
    pdf = page.print_pdf()
    assert pdf.startswith(b"%PDF") and len(pdf) > 10_000


def _impl_names(report: Path) -> list[str]:
    import gzip

    raw = gzip.open(report).read() if report.suffix == ".gz" else report.read_bytes()
    payload = json.loads(raw)
    return [i["impl"] for i in payload["impls"]] if "impls" in payload else [payload["impl"]]


def test_triage_page_in_chromium(page: Page, tmp_path: Path) -> None:
    _, captured, after = graphed_run(num_replay_steps=4, leak_bytes=1 << 20)
    leak = save_snapshot(after, tmp_path / "leak.pickle.gz")
    base = save_snapshot(captured, tmp_path / "captured.pickle")
    report = triage(str(leak), against=str(base), with_timeline=True)
    html = tmp_path / "triage.html"
    html.write_text(render_html(report), encoding="utf-8")
    _check_loaded(page, html)
    found = json.loads(page.evaluate("""JSON.stringify({
        charts: document.querySelectorAll('svg.chart').length,
        polylines: document.querySelectorAll('#timeline polyline').length,
        overall: document.getElementById('overall') && document.getElementById('overall').textContent,
        leaks: !!document.getElementById('leaks')})"""))
    assert found["charts"] == 2 and found["polylines"] >= 2 and found["leaks"]
    assert "leak suspect" in found["overall"]
    _check_screenshot(page, tmp_path / "triage.png")
