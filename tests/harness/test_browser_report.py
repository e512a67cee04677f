"""The report's first screen, checked in a real browser: headless Chromium at a 1400x1000 window.

A small real failing campaign renders its report.html; Chromium lays it out
and the test reads the layout back (bounding boxes, overflow) through the
DevTools protocol. Without scrolling, the verdict and the first kind's
expected and actual values are inside the viewport, not cut by any box, not
covered, and the page does not scroll sideways. The screenshot of the first
screen is saved in the test's tmp folder (``report-first-screen.png``).

The DevTools client is the small one below, over ``--remote-debugging-pipe``
(file descriptors 3 and 4, NUL-separated JSON), the transport Puppeteer and
Playwright use: no Python package, no driver binary to keep in step with the
browser, no TCP port on a shared CI machine; Debian's ``chromium`` is all it
needs. Outside CI a missing Chromium skips the test (the reason is the
install command); with ``CI=1`` it fails.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign

INSTALL = "apt-get install -y chromium"
WINDOW = (1400, 1000)
SUT = "mutant:fcfs_victim_head"


@pytest.fixture(scope="module")
def chromium() -> str:
    """The Chromium binary; outside CI a skip, with CI=1 a failure, when there is none."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    reason = f"no Chromium on PATH: {INSTALL}"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


class DevToolsPipe:
    """Headless Chromium driven through the DevTools protocol over its debugging pipe."""

    def __init__(self, chromium: str, user_data_dir: Path, window: tuple[int, int]) -> None:
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4; bash moves the child's ends there
        # (first copied above 9, so that neither already sits on 3 or 4).
        child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
        child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
        for fd in (to_browser_r, from_browser_w):
            os.close(fd)
        args = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={user_data_dir}",
            f"--window-size={window[0]},{window[1]}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        redirect = f'exec "$@" 3<&{child_r} 4>&{child_w} {child_r}<&- {child_w}>&-'
        self.proc = subprocess.Popen(
            ["bash", "-c", redirect, "bash", *args],
            pass_fds=(child_r, child_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        os.close(child_r)
        os.close(child_w)
        self.to_browser, self.from_browser = to_browser_w, from_browser_r
        self.buffer = b""
        self.last_id = 0

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """Send one command and return its result (events in between are skipped)."""
        self.last_id += 1
        message: dict[str, Any] = {"id": self.last_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\0" in self.buffer:
                raw, _, self.buffer = self.buffer.partition(b"\0")
                reply = json.loads(raw)
                if reply.get("id") == self.last_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_browser], [], [], left)[0]:
                raise TimeoutError(f"{method}: no answer from Chromium within {timeout_s} s")
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"{method}: Chromium exited: {self.get_stderr()[-2000:]}")
            self.buffer += chunk

    def evaluate(self, session: str, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open_page(self, url: str) -> str:
        """Load ``url`` in the first tab; returns its session id once the page has loaded."""
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        session = self.call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})["sessionId"]
        self.call("Page.navigate", {"url": url}, session)
        deadline = time.monotonic() + 30
        while self.evaluate(session, "document.readyState + ' ' + location.href") != f"complete {url}":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load within 30 s")
            time.sleep(0.05)
        return session

    def get_stderr(self) -> str:
        """What the browser wrote on stderr, once it has exited ("" while it runs)."""
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""

    def close(self) -> None:
        """Close the browser (kill it and its helpers if it does not go), and the pipes."""
        try:
            if self.proc.poll() is None:
                self.call("Browser.close", timeout_s=5)
                self.proc.wait(timeout=10)
        except (OSError, RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            pass
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the browser's own session: helpers left behind too
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
            for fd in (self.to_browser, self.from_browser):
                os.close(fd)
            if self.proc.stderr:
                self.proc.stderr.close()


# For each selector: its first element's box, whether any ancestor that clips its overflow cuts it, whether
# the element itself is cut (content wider or taller than its box), and whether the point at its centre
# hits it (nothing covers it).
LAYOUT_JS = """
(() => {
  const boxes = {};
  for (const selector of %s) {
    const el = document.querySelector(selector);
    if (!el) { boxes[selector] = null; continue; }
    const r = el.getBoundingClientRect();
    let clippedBy = null;
    for (let a = el.parentElement; a && a !== document.documentElement; a = a.parentElement) {
      const style = getComputedStyle(a);
      if (style.overflowX === 'visible' && style.overflowY === 'visible') continue;
      const b = a.getBoundingClientRect();
      if (r.left < b.left - 0.5 || r.right > b.right + 0.5 || r.top < b.top - 0.5 || r.bottom > b.bottom + 0.5) {
        clippedBy = a.tagName + (a.id ? '#' + a.id : '');
      }
    }
    const hit = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);
    boxes[selector] = {left: r.left, top: r.top, right: r.right, bottom: r.bottom, text: el.textContent,
                       clippedBy, overflows: el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0,
                       visible: hit !== null && (hit === el || el.contains(hit))};
  }
  return {boxes, width: innerWidth, height: innerHeight, scrollX, scrollY,
          pageWidth: document.documentElement.scrollWidth};
})()
"""


@pytest.fixture(scope="module")
def failing_report(tmp_path_factory):
    """A real small failing campaign (the FCFS victim-order mutant), shrunk: its folder and summary."""
    out = tmp_path_factory.mktemp("browser-runs")
    summary = run_campaign(
        CampaignSpec(sut=SUT, examples=30, seed=1, out_dir=str(out), run_id="mut", quiet=True, shrink_budget_s=15)
    )
    assert summary["status"] == "fail" and any(f["shrunk_file"] for f in summary["failures"])
    return out / "mut", summary


def test_first_screen_shows_the_verdict_and_what_differed(chromium, failing_report, tmp_path):
    run_dir, summary = failing_report
    # The first kind is the only one here; its smallest trace is the shortest minimal trace.
    [signature] = {f["signature"] for f in summary["failures"]}
    best = min((f for f in summary["failures"] if f["shrunk_file"]), key=lambda f: (f["shrunk_events"], f["index"]))
    first = best["shrunk_diffs"][0]
    assert first["field"] == signature.partition(":")[2]  # the kind's own field comes first
    browser = DevToolsPipe(chromium, tmp_path / "chromium-profile", WINDOW)
    try:
        session = browser.open_page((run_dir / "report.html").resolve().as_uri())
        selectors = [
            "#verdict",
            "#first-difference",
            "#first-difference code.expected",
            "#first-difference code.actual",
        ]
        layout = browser.evaluate(session, LAYOUT_JS % json.dumps(selectors))
        png = base64.b64decode(browser.call("Page.captureScreenshot", {"format": "png"}, session)["data"])
    finally:
        browser.close()
    shot = tmp_path / "report-first-screen.png"
    shot.write_bytes(png)
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert layout["width"] == WINDOW[0] and 600 <= layout["height"] <= WINDOW[1], layout
    assert layout["scrollX"] == 0 and layout["scrollY"] == 0
    assert layout["pageWidth"] <= layout["width"], "the page scrolls sideways"
    boxes = layout["boxes"]
    for selector, box in boxes.items():
        assert box is not None, f"{selector}: not on the page"
        where = f"{selector} at {box} in a {layout['width']}x{layout['height']} viewport (screenshot {shot})"
        assert 0 <= box["left"] < box["right"] <= layout["width"], where
        assert 0 <= box["top"] < box["bottom"] <= layout["height"], where
        assert box["clippedBy"] is None and not box["overflows"] and box["visible"], where
    assert boxes["#verdict"]["text"].split()[0] == "FAIL"
    assert boxes["#first-difference code.expected"]["text"] == first["expected"]
    assert boxes["#first-difference code.actual"]["text"] == first["actual"]
    row = boxes["#first-difference"]["text"]
    assert f"{first['field']}: expected {first['expected']}, got {first['actual']}" in " ".join(row.split())
