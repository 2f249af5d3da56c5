"""``vtop web`` in a real headless Chromium (Debian's ``chromium`` and ``chromedriver``), driven by Selenium.

Selenium rather than Playwright: it drives the chromedriver Debian ships beside its chromium (Playwright
for Python bundles its own Node driver and expects its own browser build), it is pure Python (one wheel),
and its Chrome options take Debian's binary as it is. Test-only (the ``test`` extra).

What the browser receives is read from Chromium's own performance log (the websocket frames the page got:
the ANSI that xterm.js draws; xterm.js paints on a canvas, so the DOM holds no text), and a PNG of the
page is taken (``VTOP_SCREENSHOTS=screenshots`` keeps it as ``screenshots/web-browser-readonly.png``).

A live vtop: two simulated GPUs and a server replaying a real vLLM 0.26.0 ``/metrics`` from the H200.
Proved: the page loads with the printed token and shows the GPU and server cards; a key press reaches
the app (``?`` opens the help); a wrong or missing token is refused (the page, and the websocket without
the cookie: no vtop is started for it); ``s`` does nothing without ``--allow-actions`` and says so.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.helpers.metrics_server import MetricsServer, h200_payloads

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                       reason="Debian's chromium and chromium-driver are not installed (.ci/run installs them)"),
    pytest.mark.slow,
]
selenium = pytest.importorskip("selenium", reason="selenium is a test dependency (pip install -e '.[test]')")
pytest.importorskip("textual_serve", reason="textual-serve is vtop web's dependency (pip install -e '.[web]')")

ANSI = re.compile(r"\x1b(\[[0-9;?<>=$]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[PX^_][^\x1b]*\x1b\\|.)")


class Page:
    """Chromium on one page, with the text of every websocket frame it has received so far."""

    def __init__(self, driver: Any) -> None:
        self.d = driver
        self.frames: list[str] = []

    def text(self) -> str:
        for e in self.d.get_log("performance"):
            m = json.loads(e["message"])["message"]
            if m["method"] != "Network.webSocketFrameReceived":
                continue
            r = m["params"]["response"]
            data = r["payloadData"]
            if r.get("opcode") == 2:  # binary: textual-serve's packets of the app's output
                data = base64.b64decode(data).decode("utf-8", "replace")
            self.frames.append(ANSI.sub("", data))
        return "".join(self.frames)

    def wait_for(self, what: str, cond: Callable[[str], bool], timeout: float = 90.0) -> str:
        """Wait for the received text to satisfy ``cond`` (a hang guard, not a time bound)."""
        deadline = time.monotonic() + timeout
        while True:
            t = self.text()
            if cond(t):
                return t
            if time.monotonic() > deadline:
                raise AssertionError(f"the browser never showed {what}; last received: {t[-1500:]!r}")
            time.sleep(0.2)

    def since(self, mark: int) -> str:
        self.text()
        return "".join(self.frames[mark:])


@pytest.fixture
def chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
              "--disable-dev-shm-usage", "--no-first-run"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """``vtop web`` as a user starts it (read-only: no --allow-actions); yields (url with token, base, snapshot dir)."""
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    with MetricsServer(h200_payloads(100, 40)) as srv:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vtop", "web", srv.url, "--simulate-gpus", "2", "--snapshot-dir", str(snaps)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent"})
        try:
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:  # blocks until it serves (the test's timeout guards a hang)
                lines.append(line)
                if line.startswith("vtop web: open "):
                    break
            assert lines and lines[-1].startswith("vtop web: open http://127.0.0.1:"), "".join(lines)
            assert any("read-only" in ln for ln in lines), lines
            url = lines[-1].split("open ", 1)[1].strip()
            yield url, url.split("/?token=")[0], snaps
            tabs = psutil.Process(proc.pid).children(recursive=True)
            assert tabs, "a vtop process ran for the browser tab"
        finally:
            tabs = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
            proc.terminate()
            proc.wait(timeout=30)
            _, alive = psutil.wait_procs(tabs, timeout=30)
            for p in alive:  # left behind: stop them, and fail below
                p.kill()
        assert not alive, f"vtop web left its tabs' processes running: {alive}"


def test_vtop_web_in_chromium_needs_its_token_shows_the_live_cards_and_stays_read_only(chromium, web) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    url, base, snaps = web
    token = url.split("token=", 1)[1]
    assert len(token) >= 24
    # refused without the token or with a wrong one: the page, and the websocket without its cookie
    for bad in (base + "/", base + "/?token=" + token[:-1] + ("x" if token[-1] != "x" else "y")):
        r = httpx.get(bad, timeout=30)
        assert r.status_code == 403 and "needs the token" in r.text
    ws = httpx.get(base + "/ws", timeout=30, headers={"Connection": "Upgrade", "Upgrade": "websocket",
                                                      "Sec-WebSocket-Version": "13",
                                                      "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert ws.status_code == 403
    chromium.get(base + "/?token=wrong")
    assert "needs the token" in chromium.find_element(By.TAG_NAME, "body").text

    # with the token: the live screen
    chromium.get(url)
    page = Page(chromium)
    shown = page.wait_for("the GPU and server cards with data",
                          lambda t: "GPU 0" in t and "GPU 1" in t and " UP " in t and "running" in t
                          and "/tmp/tiny" in t)
    assert "READ-ONLY" in shown
    term = chromium.find_element(By.CSS_SELECTOR, ".xterm-helper-textarea")

    # a key press reaches the app: ? opens the help
    mark = len(page.frames)
    ActionChains(chromium).send_keys_to_element(term, "?").perform()
    page.wait_for("the help screen after ?", lambda t: "vtop help" in page.since(mark))
    ActionChains(chromium).send_keys_to_element(term, "?").perform()  # closes it
    # s without --allow-actions: nothing is written, and the screen says why
    mark = len(page.frames)
    ActionChains(chromium).send_keys_to_element(term, "s").perform()
    page.wait_for("the read-only note after s", lambda t: "READ-ONLY: s (snapshot) is off" in page.since(mark))
    png = chromium.get_screenshot_as_png()
    assert png.startswith(b"\x89PNG")
    if os.environ.get("VTOP_SCREENSHOTS"):
        out = Path(os.environ["VTOP_SCREENSHOTS"]) / "web-browser-readonly.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(png)
    assert "snapshot: writing" not in page.since(mark)  # the snapshot action never ran
    assert list(snaps.iterdir()) == []
