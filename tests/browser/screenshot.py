"""Render a saved diff report to HTML and screenshot it in headless Chromium (docs images, review).

    .venv/bin/python tests/browser/screenshot.py REPORT.json OUT.png [--width 1280] [--height 1000] [--y 0]

Uses the same DevTools-pipe client as the browser tests; prints the page size and the PNG size.
"""

from __future__ import annotations

import argparse
import base64
import sys
import tempfile
from pathlib import Path

from chromium import Browser, Page, find_chromium

from graphdoctor.report.html import render_file


def main(argv: list[str]) -> int:
    """Render, load from file://, fail on page errors, write the clipped screenshot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("png")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--y", type=int, default=0, help="top of the clip in CSS pixels")
    args = parser.parse_args(argv)
    binary = find_chromium()
    if binary is None:
        sys.exit("headless Chromium not found (apt-get install chromium-headless-shell)")
    with tempfile.TemporaryDirectory() as tmp:
        html = render_file(args.report, Path(tmp) / "report.html")
        with Browser(binary) as browser:
            page = Page(browser, width=args.width, height=args.height)
            page.load(html.resolve().as_uri())
            if page.errors():
                sys.exit(f"page errors: {page.errors()}")
            clip = {"x": 0, "y": args.y, "width": args.width, "height": args.height, "scale": 1}
            data = browser.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                           "clip": clip}, page.session)["data"]
        Path(args.png).write_bytes(base64.b64decode(data))
        print(f"page {html.stat().st_size} bytes; {args.png} {Path(args.png).stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
