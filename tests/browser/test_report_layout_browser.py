"""Layout of report pages rendered from the recorded H200 reports, measured in headless Chromium's DOM at
a wide (1400 px) and a narrow (800 px) window.

Fails when an element or a line of text sticks out of its implementation card by more than 1 px (or the
card scrolls sideways), when a table cell in a card is narrower than 4 characters of its font, when a
name (module, file:line, holder path) wraps inside one of its parts, or when a chart frame is empty while
the report holds values it could plot. Every page and width prints one LAYOUT line (widest overflow in
px, narrowest cell in characters), also kept as record_property values and repeated in the terminal
summary (tests/browser/conftest.py).
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from chromium import Browser, Page
from layout import FIGURES_KEY, MEASURE

from graphdoctor.report.html import render_payload

pytestmark = pytest.mark.browser

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "data"
WIDTHS = (1400, 800, 1000, 1600)
"""The two widths of the issue, and the ends of the 1000-1600 px range the cards must hold."""

MAX_OVERFLOW_PX = 1.0
MIN_CELL_CHARS = 4.0

PAGES: dict[str, tuple[str, str]] = {
    "causes/rebound_gain": ("causes/rebound_gain.json.gz", "numeric-divergence"),
    "causes/host_temperature": ("causes/host_temperature.json.gz", "numeric-divergence"),
    "holders/fp16_dynamic": ("holders/fp16_dynamic.json.gz", "numeric-divergence"),
    "holders/holder_global": ("holders/holder_global.json.gz", "numeric-divergence"),
    "forensics/frozen_host_mask": ("forensics/h200_frozen_host_mask.json.gz", "frozen-rng"),
    "diff/item_mlp": ("diff/h200_item_mlp_schema2.json", "capture-failed"),
    "diff/dropout0": ("diff/h200_dropout0.json", "match"),
    "holders/bf16": ("holders/bf16.json.gz", "match"),
    "many-causes/one-card": ("causes/rebound_gain.json.gz", "numeric-divergence"),
    "many-causes/two-cards": ("holders/holder_global.json.gz", "numeric-divergence"),
}
"""Page id -> (recorded report under fixtures/data, a verdict one of its implementations has)."""

STRESS_ROOT = "/work/graphdoctor-runs/2026-12-02-h200/scratch/checkout"
"""An absolute checkout path as a run on a cluster node records it (the page shortens it)."""



def _read(relative: str) -> dict[str, Any]:
    path = FIXTURES / relative
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    return json.loads(raw)


def _cause(rule: str, name: str, module: str, location: str, message: str, fix: str, *,
           explains: bool = False, also_at: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"rule": rule, "name": name, "severity": "error", "module": module, "location": location,
            "also_at": list(also_at), "step": 1, "message": message, "fix": fix, "explains": explains,
            "phase": "replay"}


def many_causes(payload: dict[str, Any]) -> dict[str, Any]:
    """A recorded report with every card carrying many causes: one line's GD518 in four layers (folds into
    one row), GD509 in two, a GD522 holder path, absolute paths of a cluster checkout and long file names,
    long evidence. On rebound_gain one card has the section's width; on holder_global two cards stand side
    by side, each with half of it."""
    out = copy.deepcopy(payload)
    path = f"{STRESS_ROOT}/fixtures/planted/cause_host_temperature_annealed_every_micro_batch.py"
    holder = "optimizer.chained_optimizers[0].grad_scaler._scale"
    causes = [_cause("GD518", "host-value-baked", f"decoder.layers.{n}.mlp", f"{path}:104",
                     f"decoder.layers.{n}.mlp.forward reads the Python number self.temperature, which changes "
                     f"from step 1 on (1.05, 1.1, 1.15, 1.2, set at {path}:131); a graph captured the value it had "
                     "at capture and every replay uses that one",
                     "Keep values that change after capture in device tensors updated in place",
                     explains=n == 0, also_at=(f"{path}:131",)) for n in range(4)]
    causes += [_cause("GD509", "attribute-tensor-reassigned", f"decoder.layers.{n}.self_attention.linear_qkv",
                      "fixtures/planted/cause_rebound_gain.py:47",
                      f"decoder.layers.{n}.self_attention.linear_qkv.gain was rebound to a new tensor after the "
                      "first capture (step 1); a graph keeps reading the tensor it captured",
                      "Update the captured tensor in place with copy_()") for n in (0, 1)]
    causes.append(_cause("GD522", "captured-tensor-rebound", "",
                         "/usr/local/lib/python3.12/site-packages/megatron/core/optimizer/grad_scaler.py:143",
                         f"{holder}, a tensor a graph read at capture (step 2), was rebound to a new tensor by "
                         "megatron/core/optimizer/grad_scaler.py:143 at step 2 (changed 14 times); the graph keeps "
                         "reading the captured tensor, which is freed: every replay reads memory the allocator may "
                         "have handed to anything",
                         "Train in bf16, set a static loss scale (--loss-scale, run.loss_scale), or graph with local "
                         "or transformer_engine, which keep the loss scaling outside the graph",
                         also_at=("megatron/core/optimizer/grad_scaler.py:153",)))
    for impl in out["impls"]:
        impl["causes"] = causes
    return out


def _payload(page_id: str) -> dict[str, Any]:
    relative, _ = PAGES[page_id]
    payload = _read(relative)
    return many_causes(payload) if page_id.startswith("many-causes/") else payload


def _verdicts(payload: dict[str, Any]) -> set[str]:
    if "impls" in payload:
        return {str(i.get("verdict")) for i in payload["impls"]}
    return {str(payload.get("live_verdict"))}


def _families(payload: dict[str, Any]) -> dict[str, bool]:
    """Tensor families a graphed run compared -> whether some compared step differs there."""
    out: dict[str, bool] = {}
    for impl in payload.get("impls", []):
        run = next((r for r in impl.get("runs", []) if r.get("impl") == impl.get("impl")), None)
        for step in (run or {}).get("steps", []):
            for family in ("grads", "params"):
                diff = step.get(family)
                if isinstance(diff, dict) and not step.get("profiled"):
                    out[family] = out.get(family, False) or bool(diff.get("num_unequal"))
    return out


@pytest.fixture(scope="module")
def pages(browser: Browser) -> dict[int, Page]:
    return {width: Page(browser, width=width, height=900) for width in WIDTHS}


def _check_charts(found: dict[str, Any], payload: dict[str, Any]) -> None:
    figures = found["figures"]
    assert not [f["caption"] for f in figures if f["section"] == "loss" and f["empty"]]
    for family, differs in _families(payload).items():
        mine = [f for f in figures if f["family"] == family]
        assert mine, f"no chart of {family}"
        assert not [f["caption"] for f in mine if f["empty"]], f"{family}: an empty frame where values were recorded"
        if differs:
            # Tensors differ: each chart of the family draws them (the "all equal" band would be false).
            assert all(f["drawn"] for f in mine), [f["caption"] for f in mine if not f["drawn"]]
        # Magnitudes where every differing step was measured; else one chart of differing-tensor counts.
        plots = sorted(f["plot"] for f in mine)
        assert plots in (["max_abs", "max_rel"], ["count"]), plots
        counts = [f for f in mine if f["plot"] == "count"]
        for f in counts:
            assert "bit fingerprint on the GPU" in f["caption"] and "measuring re-run pair" in f["caption"]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page_id", list(PAGES))
def test_cards_and_charts_fit(pages: dict[int, Page], page_id: str, width: int, tmp_path: Path,
                              request: pytest.FixtureRequest, record_property: pytest.RecordProperty) -> None:
    payload = _payload(page_id)
    assert PAGES[page_id][1] in _verdicts(payload)
    html = tmp_path / "report.html"
    html.write_text(render_payload(payload, source=PAGES[page_id][0]), encoding="utf-8")
    page = pages[width]
    page.load(html.resolve().as_uri())
    assert page.errors() == []
    assert [u for u in page.requests() if not u.startswith(("file:", "data:", "about:"))] == []
    found = json.loads(page.evaluate(MEASURE))
    widest, narrowest = max(0.0, found["widest"]["px"]), found["narrowest"]
    cell = narrowest["chars"] if narrowest else None
    narrow = f"{cell:.1f} chars ({narrowest['what']})" if narrowest else "- (no table in a card)"
    # The signed excursion: how far the element nearest a card's edge lies past it (negative: inside).
    past = f" ({found['widest']['what']})" if widest > 0 else f" (nearest the edge: {found['widest']['px']:+.1f} px)"
    line = (f"LAYOUT {page_id} @ {width}px: widest overflow {widest:.1f} px{past}; "
            f"narrowest cell {narrow}; cards {found['cards']}, cells {found['numCells']}, "
            f"page width {found['pageWidth']} px")
    print(line)
    record_property("widest_overflow_px", round(widest, 1))
    record_property("narrowest_cell_chars", None if cell is None else round(cell, 1))
    request.config.stash.setdefault(FIGURES_KEY, []).append((page_id, width, widest, cell))
    assert found["cards"] >= 1
    assert widest <= MAX_OVERFLOW_PX, line
    assert found["scroll"] <= 0, f"a card scrolls sideways by {found['scroll']} px"
    assert cell is None or cell >= MIN_CELL_CHARS, line
    assert found["midName"] == [], f"names wrapped inside a part: {found['midName']}"
    assert found["pageWidth"] <= width, f"the page is {found['pageWidth']} px wide in a {width} px window"
    _check_charts(found, payload)
    if page_id.startswith("many-causes/"):
        # 7 causes per card: GD518 in 4 layers and GD509 in 2 fold to one row each.
        assert found["causeRows"] == 3 * len(payload["impls"])
        assert sum("\u00d7 4 layers" in f for f in found["folded"]) == len(payload["impls"])
    elif any(i.get("causes") for i in payload.get("impls", [])):
        assert found["causeRows"] >= 1
