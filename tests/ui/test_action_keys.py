"""The action keys in the app: s (snapshot), d (py-spy dump), t (test request), and --readonly.

Real processes and real HTTP on loopback; slow answers are made slow on purpose to
show the dashboard keeps answering while an action runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from vtop.config import Config
from vtop.sources.discovery import ProcRecord, discover
from vtop.ui.app import VtopApp
from vtop.ui.screens import ProbeScreen, PySpyScreen

SHOTS = os.environ.get("VTOP_SCREENSHOTS")
METRICS = (FIXTURES / "vllm" / "cpu-0.32.0-metrics-load.txt").read_bytes()


def sse(chunks: list[dict]) -> bytes:  # type: ignore[type-arg]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


@pytest.fixture
async def vllm_like() -> AsyncIterator[dict]:  # type: ignore[type-arg]
    """A loopback server that answers like vLLM: /metrics, /health, /v1/models, a streamed chat."""
    state: dict = {"delay": 0.0, "metrics_delay": 0.0, "requests": [], "url": ""}  # type: ignore[type-arg]

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = await r.readuntil(b"\r\n\r\n")
            first = head.split(b"\r\n")[0].decode()
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await r.readexactly(length) if length else b""
            path = first.split()[1]
            if path == "/metrics":
                await asyncio.sleep(state["metrics_delay"])
                payload, ctype = METRICS, "text/plain"
            elif path == "/v1/models":
                payload = json.dumps({"data": [{"id": "tiny", "max_model_len": 2048}]}).encode()
                ctype = "application/json"
            elif path.startswith("/v1/chat"):
                state["requests"].append(json.loads(body))
                await asyncio.sleep(state["delay"])
                chunks = [{"choices": [{"delta": {"content": f"w{i} "}, "finish_reason": None}]} for i in range(8)]
                chunks.append({"choices": [{"delta": {}, "finish_reason": "length"}]})
                chunks.append({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 8}})
                payload, ctype = sse(chunks), "text/event-stream"
            else:
                payload, ctype = b"", "text/plain"
            w.write(f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"
                    "Connection: close\r\n\r\n".encode() + payload)
            await w.drain()
            w.close()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    state["url"] = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    async with srv:
        yield state
        srv.close()


def app_for(url: str, tmp_path: Path, **cfg: object) -> VtopApp:
    return VtopApp(Config(urls=(url,), no_gpu=True, interval=0.5, snapshot_dir=str(tmp_path), **cfg),  # type: ignore[arg-type]
                   hostname="t")


async def wait_for(pilot, cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await pilot.pause(0.1)


async def test_snapshot_key_writes_a_bundle_and_refuses_a_second(vllm_like, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "vllm.log"
    log.write_bytes((FIXTURES / "logs" / "vllm-0.32.0-cpu-startup.log").read_bytes())
    out = tmp_path / "bundles"
    out.mkdir()
    app = app_for(vllm_like["url"], out, log=str(log))
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause(1.0)
        vllm_like["metrics_delay"] = 2.0  # the bundle waits for a slow /metrics
        await pilot.press("s")
        await pilot.press("s")  # while the first is still going
        assert any("already being written" in n.message for n in app._notifications)
        await wait_for(pilot, lambda: app.last_snapshot is not None)
        res = app.last_snapshot
        assert res.ok, res.message
        folder = Path(res.path)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        names = {p.name for p in folder.iterdir()}
        assert {"vllm.log", "history.json", "screen.svg", "README.txt"} <= names
        assert any(n.startswith("metrics-") for n in names)
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())
        assert (folder / "vllm.log").read_bytes() == log.read_bytes()
        # notify() posts a message: the toast is in the list once the app has handled it
        await wait_for(pilot, lambda: any(str(folder) in n.message or folder.name in n.message
                                          for n in app._notifications), 5)


@pytest.mark.parametrize("redact", [True, False])
async def test_snapshot_follows_redact_prompts(vllm_like, tmp_path: Path, redact: bool) -> None:  # type: ignore[no-untyped-def]
    """--redact-prompts (default on) takes prompts out of the copied log; --no-redact-prompts keeps them."""
    log = tmp_path / "vllm.log"
    lines = (FIXTURES / "logs" / "requests" / "vllm-0.11.0-v1.log").read_text().splitlines()
    log.write_text("\n".join(ln for ln in lines if not ln.startswith("#")) + "\n")
    prompt_line = next(ln for ln in lines if "Received request" in ln and "prompt: '" in ln)
    prompt = prompt_line.split("prompt: '", 1)[1][:20]
    out = tmp_path / "bundles"
    out.mkdir()
    app = app_for(vllm_like["url"], out, log=str(log), redact_prompts=redact)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause(0.5)
        await pilot.press("s")
        await wait_for(pilot, lambda: app.last_snapshot is not None)
        copied = (Path(app.last_snapshot.path) / "vllm.log").read_text()
        assert (prompt in copied) is (not redact)
        assert json.loads((Path(app.last_snapshot.path) / "alerts.json").read_text()) == [a.to_json() for a in app.alerts]


@pytest.fixture
def python_child() -> AsyncIterator[subprocess.Popen]:  # type: ignore[type-arg]
    code = "import time\ndef vtop_test_busy_loop():\n    while True:\n        time.sleep(0.05)\nvtop_test_busy_loop()\n"
    p = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(0.5)
    yield p  # type: ignore[misc]
    p.kill()
    p.wait()


async def test_pyspy_key_dumps_the_engine_in_a_screen(vllm_like, tmp_path: Path, python_child) -> None:  # type: ignore[no-untyped-def]
    app = app_for(vllm_like["url"], tmp_path)
    port = int(vllm_like["url"].rsplit(":", 1)[1])
    recs = [
        ProcRecord(4242, 1, "vllm", ("/usr/bin/python3", "/usr/bin/vllm", "serve", "tiny", "--port", str(port)), 1.0),
        ProcRecord(python_child.pid, 4242, "VLLM::EngineCor", ("VLLM::EngineCore",), 2.0),
    ]
    servers = list(discover(recs).servers)
    async with app.run_test(size=(110, 36)) as pilot:
        app.apply_procs(servers)
        await pilot.press("d")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, PySpyScreen) and screen.target.pid == python_child.pid
        t0 = time.monotonic()
        await pilot.press("down")  # the screen answers (scrolls) while py-spy runs
        assert time.monotonic() - t0 < 0.5
        await wait_for(pilot, lambda: screen.result is not None, 30)
        assert screen.result.ok, screen.result.message
        text = str(app.screen.query_one("#dump").render())
        assert "vtop_test_busy_loop" in text
        first = screen.result
        await pilot.press("n")  # again, with native frames
        await wait_for(pilot, lambda: screen.result is not first, 30)
        assert screen.result.ok and screen.result.native
        second = screen.result
        await pilot.press("a")  # the API server instead: pid 4242 is not a real process here
        await wait_for(pilot, lambda: screen.result is not second, 30)
        assert screen.target.role == "api_server" and screen.target.pid == 4242
        assert not screen.result.ok and screen.result.kind == "gone"
        assert "4242" in str(app.screen.query_one("#dump").render())
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            app.save_screenshot(str(Path(SHOTS) / "pyspy-screen.svg"))
        await pilot.press("escape")
        assert not isinstance(app.screen, PySpyScreen)


async def test_pyspy_key_without_a_process_says_so(tmp_path: Path) -> None:
    app = VtopApp(Config(urls=("http://127.0.0.1:9",), no_gpu=True), autopoll=False, hostname="t")
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.press("d")
        assert any("no vLLM process found" in n.message for n in app._notifications)


async def test_test_request_form_sends_with_max_tokens_and_stays_responsive(vllm_like, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    vllm_like["delay"] = 1.5  # a slow server
    app = app_for(vllm_like["url"], tmp_path)
    async with app.run_test(size=(110, 36)) as pilot:
        await pilot.pause(1.0)
        await pilot.press("t")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ProbeScreen)
        assert "never sends a request without max_tokens" in str(screen.query_one("#probe-why").render())
        max_in = screen.query_one("#max-tokens")
        max_in.value = ""  # no max_tokens: nothing may be sent
        await pilot.click("#send")
        await wait_for(pilot, lambda: screen.result is not None)
        assert not screen.result.ok and not screen.result.sent
        assert vllm_like["requests"] == []
        screen.result = None
        max_in.focus()
        await pilot.press("8", "enter")  # typed by hand, sent with enter
        prompt = screen.query_one("#prompt")
        prompt.focus()
        t0 = time.monotonic()
        await pilot.press("end", "x")  # typing while the request is in flight is handled at once
        assert time.monotonic() - t0 < 0.5 and prompt.value.endswith("x")
        try:
            await wait_for(pilot, lambda: screen.result is not None, 20)
        except AssertionError as e:
            raise AssertionError(f"no result; requests={vllm_like['requests']} focused={app.focused} "
                                 f"text={screen.query_one('#probe-result').render()}") from e
        r = screen.result
        assert r.ok and r.finish_reason == "length" and r.output_tokens == 8
        assert vllm_like["requests"][0]["max_tokens"] == 8 and vllm_like["requests"][0]["temperature"] == 0
        text = str(screen.query_one("#probe-result").render())
        assert "finish_reason length" in text and "TTFT" in text
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            app.save_screenshot(str(Path(SHOTS) / "test-request-result.svg"))


async def test_readonly_turns_the_action_keys_off(vllm_like, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    app = app_for(vllm_like["url"], tmp_path, readonly=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(1.0)
        for key in ("s", "d", "t"):
            await pilot.press(key)
        await pilot.pause(0.5)
        assert app.screen is app.screen_stack[0]  # no dialog opened
        assert app.last_snapshot is None and not list(tmp_path.iterdir())
        assert "READ-ONLY" in app._status_text
        assert app.check_action("snapshot", ()) is None and app.check_action("toggle_log", ()) is True
        assert app.check_action("readonly_info", ()) is True  # "READ-ONLY: s d t off" in the footer


async def test_readonly_note_is_not_in_a_normal_footer(tmp_path: Path) -> None:
    app = VtopApp(Config(no_gpu=True), autopoll=False, hostname="t")
    async with app.run_test(size=(100, 30)):
        assert app.check_action("readonly_info", ()) is False and app.check_action("snapshot", ()) is True


async def test_pyspy_dump_is_saved_into_the_latest_snapshot(vllm_like, tmp_path: Path, python_child) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "vtop-snapshot-20261130-120000").mkdir(mode=0o700)
    app = app_for(vllm_like["url"], tmp_path)
    port = int(vllm_like["url"].rsplit(":", 1)[1])
    recs = [
        ProcRecord(4242, 1, "vllm", ("/usr/bin/python3", "/usr/bin/vllm", "serve", "tiny", "--port", str(port)), 1.0),
        ProcRecord(python_child.pid, 4242, "VLLM::EngineCor", ("VLLM::EngineCore",), 2.0),
    ]
    async with app.run_test(size=(110, 36)) as pilot:
        app.apply_procs(list(discover(recs).servers))
        await pilot.press("d")
        screen = app.screen
        await wait_for(pilot, lambda: screen.result is not None, 30)
        saved = list((tmp_path / "vtop-snapshot-20261130-120000").glob("pyspy-*.txt"))
        assert len(saved) == 1 and "vtop_test_busy_loop" in saved[0].read_text()
        assert stat.S_IMODE(saved[0].stat().st_mode) == 0o600
