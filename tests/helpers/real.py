"""What the real tier's tests share (a real vLLM server, the CPU build): the app that watches it
and samples what it shows (``Watch``), its screenshots (``VTOP_SCREENSHOTS=DIR``) and recordings
(``VTOP_RECORD_DIR=DIR``), the load that makes an incident (``Runaway``, ``ShortTraffic``), and a
tmux pane's text (``capture``, ``log_box``)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from vtop.config import Config
from vtop.ui.app import VtopApp

SHOTS = os.environ.get("VTOP_SCREENSHOTS")


def shot(app: VtopApp, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        app.save_screenshot(str(Path(SHOTS) / name))


class Watch:
    """Samples what the app shows, every 0.25 s, while the test waits for something."""

    def __init__(self, app: VtopApp, url: str) -> None:
        self.app, self.url = app, url
        self.server_states: list[str] = []
        self.phases: list[str] = []
        self.samples: list[dict[str, Any]] = []

    def view(self) -> Any:
        e = self.app.monitor.servers.get(self.url)
        return e.last_view if e else None

    def sample(self) -> None:
        v = self.view()
        if v is not None and (not self.server_states or self.server_states[-1] != v.state):
            self.server_states.append(v.state)
        lv = self.app.log_view
        if lv is not None and lv.snapshot.current is not None:
            name = lv.snapshot.current.value
            if not self.phases or self.phases[-1] != name:
                self.phases.append(name)
        if v is not None and v.total is not None:
            self.samples.append({"t": time.monotonic(), "state": v.state, "running": v.total.running,
                                 "waiting": v.total.waiting, "gen_tps": v.gen_tps, "prompt_tps": v.prompt_tps,
                                 "finished": dict(v.finished or {})})

    async def until(self, pilot: Any, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sample()
            if cond():
                return
            await pilot.pause(0.25)
        self.sample()
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; states {self.server_states}, "
                             f"phases {self.phases}")


REC = os.environ.get("VTOP_RECORD_DIR")


async def until(pilot: Any, cond: Callable[[], Any], timeout: float, what: str) -> None:
    """Let the app run (``pilot.pause``) until ``cond()`` holds; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await pilot.pause(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def app_for(srv: Any, tmp: Path, name: str, **cfg: Any) -> VtopApp:
    rec = Path(REC) / f"{name}.jsonl.gz" if REC else tmp / f"{name}.jsonl.gz"
    rec.parent.mkdir(parents=True, exist_ok=True)
    if rec.exists():
        rec.unlink()
    cfg.setdefault("interval", 0.5)
    return VtopApp(Config(urls=(srv.url,), log=str(srv.log_path), no_gpu=True, record=str(rec), **cfg),
                   hostname="cpu-box")


class Runaway:
    """One streaming chat request without max_tokens (ignore_eos), in a thread, until stopped."""

    def __init__(self, srv: Any) -> None:
        self.srv = srv
        self.id: str | None = None
        self.chunks = 0
        self.finish: str | None = None
        self.error: str | None = None
        #: ``(host, port)`` of the client's side of its connection (httpcore's ``network_stream`` extension)
        self.client: tuple[str, int] | None = None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Runaway:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=30)

    def _run(self) -> None:
        body = {"model": self.srv.model, "stream": True, "ignore_eos": True, "temperature": 0.8,
                "messages": [{"role": "user", "content": "Tell me a very long story."}]}
        try:
            with httpx.Client(timeout=httpx.Timeout(30.0, read=60.0)) as c, \
                    c.stream("POST", self.srv.url + "/v1/chat/completions", json=body) as r:
                ns = r.extensions.get("network_stream")
                if ns is not None:
                    addr = ns.get_extra_info("client_addr")
                    self.client = (str(addr[0]), int(addr[1])) if addr else None
                for line in r.iter_lines():
                    if self._stop.is_set():
                        return  # closing the stream: vLLM aborts the request
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    d = json.loads(line[6:])
                    self.id = self.id or d.get("id")
                    self.chunks += 1
                    fr = (d.get("choices") or [{}])[0].get("finish_reason")
                    if fr:
                        self.finish = fr
                        return
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = f"{type(e).__name__}: {e}"


SHORT_MAX_REQUESTS = 40


class ShortTraffic:
    """Short completions (max_tokens 16-64), one every 2-5 s, in a thread, until stopped."""

    def __init__(self, srv: Any, seed: int = 24) -> None:
        self.srv = srv
        self.rng = random.Random(seed)
        self.finished: list[float] = []  # time.monotonic() of each 200 answer
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="short-traffic")

    def __enter__(self) -> ShortTraffic:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=60)

    def _run(self) -> None:
        # A fresh connection for each request: vLLM's uvicorn closes an idle keep-alive connection after 5 s
        # (VLLM_HTTP_TIMEOUT_KEEP_ALIVE) and these waits are 2-5 s, so a pooled connection can be closed just as a
        # request goes out ("Server disconnected without sending a response"); docker-proxy widens that window.
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=self.srv.url, timeout=httpx.Timeout(60.0, connect=5.0), limits=limits) as c:
            for i in range(SHORT_MAX_REQUESTS):
                if self._stop.wait(self.rng.uniform(2.0, 5.0)):
                    return
                body = {"model": self.srv.model, "prompt": f"Say something short #{i}",
                        "max_tokens": self.rng.randint(16, 64), "ignore_eos": True}
                try:
                    r = c.post("/v1/completions", json=body)
                    if r.status_code == 200:
                        self.finished.append(time.monotonic())
                    else:
                        self.failed.append(f"HTTP {r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failed.append(f"{type(e).__name__}: {e}")


def capture(sess: str) -> list[str]:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", sess], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def log_box(rows: list[str]) -> tuple[int, int] | None:
    """First and last row of the log pane's box (the last rounded box on screen), if shown."""
    tops = [i for i, r in enumerate(rows) if r.startswith("╭")]
    if not tops:
        return None
    top = tops[-1]
    bottom = next((i for i in range(top + 1, len(rows)) if rows[i].startswith("╰")), None)
    return None if bottom is None else (top, bottom)
