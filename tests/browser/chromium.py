"""A small Chrome DevTools Protocol client over --remote-debugging-pipe, for the browser tests.

Starts headless Chromium with the protocol on file descriptors 3 (commands in) and 4 (replies out),
NUL-separated JSON; no websocket library, no port. Collects JavaScript exceptions, console errors,
log errors and every non-file request while a page loads.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium-headless-shell", "chrome-headless-shell", "chromium", "chromium-browser", "google-chrome")
"""Binaries looked up on PATH, in order; GRAPHDOCTOR_CHROMIUM overrides."""


def find_chromium() -> str | None:
    """Path of a headless-capable Chromium, or None."""
    override = os.environ.get("GRAPHDOCTOR_CHROMIUM")
    if override:
        return shutil.which(override) or (override if Path(override).exists() else None)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(RuntimeError):
    """The browser answered a command with an error, closed, or did not answer in time."""


class Browser:
    """One headless Chromium process driven through the DevTools pipe."""

    def __init__(self, binary: str, *, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self._profile = tempfile.TemporaryDirectory(prefix="gd-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # High, close-on-exec copies: dup2 onto 3 and 4 then clears close-on-exec on those only.
        in_fd = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 20)
        out_fd = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 20)
        os.close(to_child_r)
        os.close(from_child_w)
        log = os.path.join(self._profile.name, "chromium.log")
        args = [binary, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
                "--disable-dev-shm-usage", "--font-render-hinting=none",
                f"--user-data-dir={self._profile.name}", "about:blank"]
        actions = [(os.POSIX_SPAWN_DUP2, in_fd, 3), (os.POSIX_SPAWN_DUP2, out_fd, 4),
                   (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_CREAT, 0o644),
                   (os.POSIX_SPAWN_DUP2, 1, 2), (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
        self.pid = os.posix_spawn(binary, args, os.environ, file_actions=actions)
        os.close(in_fd)
        os.close(out_fd)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        """Ask the browser to exit, then reap it (kill after 10 s)."""
        try:
            self._send("Browser.close", {}, None)
        except OSError:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.05)
        else:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self._to_child)
        os.close(self._from_child)
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, params: dict[str, Any], session: str | None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError("no answer from Chromium in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise CDPError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile go to self.events."""
        sent = self._send(method, params or {}, session)
        deadline = time.monotonic() + self.timeout_s
        while True:
            message = self._receive(deadline)
            if message.get("id") == sent:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_event(self, method: str, session: str, deadline: float) -> dict[str, Any]:
        """Wait for an event (already received ones count) and return it."""
        while True:
            for event in self.events:
                if event.get("method") == method and event.get("sessionId") == session:
                    self.events.remove(event)
                    return event
            self.events.append(self._receive(deadline))


class Page:
    """A tab: load a URL, evaluate script, take a screenshot, report errors."""

    def __init__(self, browser: Browser, *, width: int = 1280, height: int = 900) -> None:
        self.browser = browser
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self._call(f"{domain}.enable")
        self._call("Emulation.setDeviceMetricsOverride",
                   {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, self.session)

    def load(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self.browser.events.clear()
        self._call("Page.navigate", {"url": url})
        self.browser.wait_event("Page.loadEventFired", self.session, time.monotonic() + self.browser.timeout_s)

    def errors(self) -> list[str]:
        """JavaScript exceptions, console errors and log errors seen since the last load."""
        out = []
        for event in self.browser.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                out.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(f"console.{params['type']}: {[a.get('value') for a in params.get('args', [])]}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        return out

    def requests(self) -> list[str]:
        """URLs of every request the page made since the last load."""
        return [e["params"]["request"]["url"] for e in self.browser.events
                if e.get("method") == "Network.requestWillBeSent"]

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise CDPError(f"evaluate {expression!r}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def screenshot(self, *, full_page: bool = False, max_height: int = 16000) -> bytes:
        """PNG bytes of the viewport (or of the whole page, up to max_height pixels)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self._call("Page.getLayoutMetrics")["cssContentSize"]
            params["captureBeyondViewport"] = True
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], max_height),
                              "scale": 1}
        return base64.b64decode(self._call("Page.captureScreenshot", params)["data"])

    def print_pdf(self) -> bytes:
        """The page printed to PDF (print stylesheet applied)."""
        return base64.b64decode(self._call("Page.printToPDF", {"printBackground": True})["data"])


__all__ = ["CANDIDATES", "Browser", "CDPError", "Page", "find_chromium"]
