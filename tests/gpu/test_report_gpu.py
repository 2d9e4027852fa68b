"""`graphdoctor diff --html` on a real GPU: the page written with the run, and the same report saved as
JSON and rendered again by `graphdoctor report`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main

pytestmark = pytest.mark.gpu

SMALL = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "64",
         "--vocab-size", "512", "--steps", "6", "--cuda-graph-warmup-steps", "2", "--timeout", "240"]
MAX_PAGE_BYTES = 2 * 1024 * 1024


def _out_dir(tmp_path: Path) -> Path:
    # GRAPHDOCTOR_REPORT_OUT keeps the JSON and the pages (for the docs and the closing note).
    keep = os.environ.get("GRAPHDOCTOR_REPORT_OUT")
    out = Path(keep) if keep else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    return out


def _diff_and_report(out: Path, name: str, *args: str) -> tuple[dict, str, str]:
    report_json, page, again = out / f"{name}.json", out / f"{name}.html", out / f"{name}.report.html"
    result = CliRunner().invoke(main, ["diff", *SMALL, *args, "--json", str(report_json), "--html", str(page)])
    assert result.exit_code in (0, 1), result.output
    rendered = CliRunner().invoke(main, ["report", str(report_json), "--html", str(again)])
    assert rendered.exit_code == 0, rendered.output
    assert page.stat().st_size < MAX_PAGE_BYTES and again.stat().st_size < MAX_PAGE_BYTES
    return json.loads(report_json.read_text()), page.read_text(), again.read_text()


def test_diff_html_dropout_local_and_full_iteration(tmp_path: Path) -> None:
    payload, page, again = _diff_and_report(_out_dir(tmp_path), "h200_small_dropout0.1",
                                            "--impl", "local,full_iteration", "--dropout", "0.1")
    for html in (page, again):
        for impl in payload["impls"]:
            assert f'data-impl="{impl["impl"]}"' in html and f'data-verdict="{impl["verdict"]}"' in html
        for section in ('id="loss"', 'id="numeric"', 'id="memory"', 'id="launches"', "Graph census"):
            assert section in html
        assert "https://" not in html and "<script" not in html


def test_diff_html_capture_failure_names_the_line(tmp_path: Path) -> None:
    payload, page, _ = _diff_and_report(_out_dir(tmp_path), "h200_small_item_mlp", "--impl", "local",
                                        "--dropout", "0", "--layer-spec", "fixtures.planted.item_mlp:layer_spec")
    (impl,) = payload["impls"]
    assert impl["verdict"] == "capture-failed"
    assert "GD501" in page and impl["diagnosis"]["location"] in page
