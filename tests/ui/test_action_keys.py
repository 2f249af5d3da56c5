"""The action keys in the app: s (snapshot), d (py-spy dump), t (test request), and --readonly.

Real processes and real HTTP on loopback. "Keeps answering while an action runs" is
shown by holding the action (an Event the fake server or a wrapper waits on) until the
test has seen a key's effect: no test here times anything (latency is bench/'s). Waits
are for events; GUARD_S only stops a hang and never decides a healthy run.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.helpers.pilot import GUARD_S, log_pane_settled, polled, wait_for
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
    # chat_gate: when set to an Event, a chat request is held (after it was recorded) until it is set
    state: dict = {"chat_gate": None, "requests": [], "url": ""}  # type: ignore[type-arg]

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
                payload, ctype = METRICS, "text/plain"
            elif path == "/v1/models":
                payload = json.dumps({"data": [{"id": "tiny", "max_model_len": 2048}]}).encode()
                ctype = "application/json"
            elif path.startswith("/v1/chat"):
                state["requests"].append(json.loads(body))
                if state["chat_gate"] is not None:
                    await state["chat_gate"].wait()
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


def app_for(url: str, tmp_path: Path, autopoll: bool = True, **cfg: object) -> VtopApp:
    return VtopApp(Config(urls=(url,), no_gpu=True, interval=0.5, snapshot_dir=str(tmp_path), **cfg),  # type: ignore[arg-type]
                   autopoll=autopoll, hostname="t")


async def test_snapshot_key_writes_a_bundle_and_refuses_a_second(vllm_like, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "vllm.log"
    log.write_bytes((FIXTURES / "logs" / "vllm-0.32.0-cpu-startup.log").read_bytes())
    out = tmp_path / "bundles"
    out.mkdir()
    app = app_for(vllm_like["url"], out, log=str(log))
    # The bundle is held at its first progress report (it is copying the log, in its thread)
    # until the second s has been answered: "a second s while the first runs" by construction.
    copying, go_on = threading.Event(), threading.Event()
    report = app._snapshot_progress_from_thread

    def held_report(done: int, total: int) -> None:
        copying.set()
        go_on.wait(GUARD_S)
        report(done, total)

    app._snapshot_progress_from_thread = held_report  # type: ignore[method-assign]
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        try:
            await wait_for(pilot, lambda: polled(app, vllm_like["url"]))
            await pilot.press("s")
            await wait_for(pilot, copying.is_set)
            await pilot.press("s")  # the first is still held
            # proves: the second s is refused while the first bundle is still being written
            await wait_for(pilot, lambda: any("already being written" in n.message for n in app._notifications))
            assert app.last_snapshot is None and not go_on.is_set()
        finally:
            go_on.set()
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
                                          for n in app._notifications))
        await log_pane_settled(pilot, app)


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
        await wait_for(pilot, lambda: polled(app, vllm_like["url"]))
        await pilot.press("s")
        await wait_for(pilot, lambda: app.last_snapshot is not None)
        copied = (Path(app.last_snapshot.path) / "vllm.log").read_text()
        assert (prompt in copied) is (not redact)
        assert json.loads((Path(app.last_snapshot.path) / "alerts.json").read_text()) == [a.to_json() for a in app.alerts]
        await log_pane_settled(pilot, app)


@pytest.fixture
def python_child() -> AsyncIterator[subprocess.Popen]:  # type: ignore[type-arg]
    code = ("import time\ndef vtop_test_busy_loop():\n    print('ready', flush=True)\n    while True:\n"
            "        time.sleep(0.05)\nvtop_test_busy_loop()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    # in its loop once it says so (a sleep of "long enough" was not, on a loaded box)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    yield p  # type: ignore[misc]
    p.kill()
    p.wait()
    if p.stdout is not None:
        p.stdout.close()


async def test_pyspy_key_dumps_the_engine_in_a_screen(vllm_like, tmp_path: Path, python_child,  # type: ignore[no-untyped-def]
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from vtop.ui import screens

    # The first py-spy run is held until the screen has answered a key: "the screen answers
    # while py-spy runs" by construction, not by timing. Later runs go straight through.
    running, go_on = asyncio.Event(), asyncio.Event()
    real_dump = screens.dump

    async def held_dump(*a, **k):  # type: ignore[no-untyped-def]
        running.set()
        await go_on.wait()
        return await real_dump(*a, **k)

    monkeypatch.setattr(screens, "dump", held_dump)
    # no process scan of its own: the processes given below stay the only ones (a real scan
    # that landed after them, as on a loaded box, took them away before the d key)
    app = app_for(vllm_like["url"], tmp_path, autopoll=False)
    port = int(vllm_like["url"].rsplit(":", 1)[1])
    recs = [
        ProcRecord(4242, 1, "vllm", ("/usr/bin/python3", "/usr/bin/vllm", "serve", "tiny", "--port", str(port)), 1.0),
        ProcRecord(python_child.pid, 4242, "VLLM::EngineCor", ("VLLM::EngineCore",), 2.0),
    ]
    servers = list(discover(recs).servers)
    async with app.run_test(size=(110, 36), notifications=True) as pilot:
        app.apply_procs(servers)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, PySpyScreen))
        screen = app.screen
        assert isinstance(screen, PySpyScreen) and screen.target.pid == python_child.pid
        try:
            await wait_for(pilot, running.is_set)
            await pilot.press("s")  # save: nothing yet
            # proves: the screen handles a key while py-spy is still running (held)
            await wait_for(pilot, lambda: any("nothing to save yet" in n.message for n in app._notifications))
            assert screen.result is None and not go_on.is_set()
        finally:
            go_on.set()
        await wait_for(pilot, lambda: screen.result is not None)
        assert screen.result.ok, screen.result.message
        text = str(app.screen.query_one("#dump").render())
        assert "vtop_test_busy_loop" in text
        first = screen.result
        await pilot.press("n")  # again, with native frames
        await wait_for(pilot, lambda: screen.result is not first)
        assert screen.result.ok and screen.result.native
        second = screen.result
        await pilot.press("a")  # the API server instead: pid 4242 is not a real process here
        await wait_for(pilot, lambda: screen.result is not second)
        assert screen.target.role == "api_server" and screen.target.pid == 4242
        assert not screen.result.ok and screen.result.kind == "gone"
        assert "4242" in str(app.screen.query_one("#dump").render())
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            app.save_screenshot(str(Path(SHOTS) / "pyspy-screen.svg"))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, PySpyScreen))  # dismissed


async def test_pyspy_key_without_a_process_says_so(tmp_path: Path) -> None:
    app = VtopApp(Config(urls=("http://127.0.0.1:9",), no_gpu=True), autopoll=False, hostname="t")
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.press("d")
        # notify() posts a message: the toast is in the list once the app has handled it
        await wait_for(pilot, lambda: any("no vLLM process found" in n.message for n in app._notifications))


async def test_test_request_form_sends_with_max_tokens_and_stays_responsive(vllm_like, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    app = app_for(vllm_like["url"], tmp_path)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_for(pilot, lambda: polled(app, vllm_like["url"]))  # the form is filled from it
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen) and bool(app.screen.query("#send")))  # composed
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
        gate = vllm_like["chat_gate"] = asyncio.Event()  # the server holds the request from now on
        max_in.focus()
        try:
            await pilot.press("8", "enter")  # typed by hand, sent with enter
            await wait_for(pilot, lambda: vllm_like["requests"])  # it reached the server, held there
            prompt = screen.query_one("#prompt")
            prompt.focus()
            await pilot.press("end", "x")
            # proves: typing is handled while the request is still in flight (held by the server)
            await wait_for(pilot, lambda: prompt.value.endswith("x"))
            assert screen.result is None and not gate.is_set()
        finally:
            gate.set()
        try:
            await wait_for(pilot, lambda: screen.result is not None)
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
        await wait_for(pilot, lambda: polled(app, vllm_like["url"]))  # a server to act on
        for key in ("s", "d", "t"):
            await pilot.press(key)
        await pilot.pause(0.5)  # room for a wrongly started action to show (cannot fail a healthy run)
        assert app.screen is app.screen_stack[0]  # no dialog opened
        assert app.last_snapshot is None and not list(tmp_path.iterdir())
        assert "READ-ONLY" in app._status_text
        assert app.check_action("snapshot", ()) is None and app.check_action("toggle_log", ()) is True
        # the help screen (?) says why they are off
        assert any("READ-ONLY" in n for n in app.help_notes())
        assert ("s", app.KEY_HELP["snapshot"], False) in app.help_keys()


async def test_readonly_note_is_not_in_a_normal_help(tmp_path: Path) -> None:
    app = VtopApp(Config(no_gpu=True), autopoll=False, hostname="t")
    async with app.run_test(size=(100, 30)):
        assert not app.help_notes() and app.check_action("snapshot", ()) is True


async def test_pyspy_dump_is_saved_into_the_latest_snapshot(vllm_like, tmp_path: Path, python_child) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "vtop-snapshot-20261130-120000").mkdir(mode=0o700)
    # no process scan of its own: the processes given below stay the only ones (a real scan
    # that landed after them, as on a loaded box, took them away before the d key)
    app = app_for(vllm_like["url"], tmp_path, autopoll=False)
    port = int(vllm_like["url"].rsplit(":", 1)[1])
    recs = [
        ProcRecord(4242, 1, "vllm", ("/usr/bin/python3", "/usr/bin/vllm", "serve", "tiny", "--port", str(port)), 1.0),
        ProcRecord(python_child.pid, 4242, "VLLM::EngineCor", ("VLLM::EngineCore",), 2.0),
    ]
    async with app.run_test(size=(110, 36)) as pilot:
        app.apply_procs(list(discover(recs).servers))
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, PySpyScreen))  # pushed: an event, not "by now"
        screen = app.screen
        assert isinstance(screen, PySpyScreen)
        await wait_for(pilot, lambda: screen.result is not None)
        saved = list((tmp_path / "vtop-snapshot-20261130-120000").glob("pyspy-*.txt"))
        assert len(saved) == 1 and "vtop_test_busy_loop" in saved[0].read_text()
        assert stat.S_IMODE(saved[0].stat().st_mode) == 0o600


async def test_a_tick_while_the_screen_is_taken_down_paints_without_a_query_error(tmp_path: Path) -> None:
    # The real tier's action-keys test failed on main with NoMatches("No nodes match '#servers-msg' on
    # Screen(id='_default')"): a tick's layout (_fit) looked its rows up by query while the app exited and
    # the screen's widgets were already being removed. Here the servers' message row is removed as the
    # teardown does, then the layout runs (no server card: that row is laid out).
    app = VtopApp(Config(urls=("http://127.0.0.1:9",), no_gpu=True), autopoll=False, hostname="t")
    async with app.run_test(size=(100, 30)) as pilot:
        await app.screen_stack[0].query_one("#servers-msg").remove()
        await pilot.pause()
        app._fit()  # what a tick's paint runs when the alerts, servers or log changed: no NoMatches
