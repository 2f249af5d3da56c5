"""Secrets, end to end through the keys (issue #25 item 3, its proof).

A process on this box that looks to vtop like ``vllm serve /tmp/tiny --api-key KEY`` (a Python
running a script named ``vllm``, ``HF_TOKEN=hf_...`` in its environment) answers like vLLM on a
loopback port and writes a log with vLLM's ``non-default args: {... 'api_key': [...]}``, an
``Authorization: Bearer`` header, ``HF_TOKEN=`` and a prompt. The real app watches it, with
``--record`` and ``--log``, and the keys are pressed as a person would: ``s`` (an incident
bundle, with its screen.svg), ``d`` (py-spy dump of the server: py-spy prints its command line,
which carries the key; the dump is saved into the bundle), ``s`` on the dump's screen (saved
again), ``s`` on the dashboard again (a second bundle). Then ``vtop --once --json --record`` as
a separate process. Every file vtop wrote is searched for every planted value (``grep -r``
over the plain files, and the gzip recordings opened): none is there; every file is 0600 and
every bundle folder 0700.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.helpers.pilot import GUARD_S, log_pane_settled, polled, wait_for
from vtop.config import Config
from vtop.ui.app import VtopApp
from vtop.ui.screens import PySpyScreen

KEY = "S3cr3t-keys-api-key-7171"
HF = "hf_PLANTEDkeysTOKENplanted7171"
BEARER = "sk-PLANTEDkeysBEARER7171"
PROMPT = "a very private prompt typed through the keys"
PLANTED = (KEY, HF, BEARER, PROMPT)
PYSPY = Path(sys.executable).parent / "py-spy"
METRICS = FIXTURES / "vllm" / "cpu-0.32.0-metrics-load.txt"

# What runs as "vllm": answers /metrics, /health, /version and /v1/models (only with the key,
# as vLLM does with --api-key), and logs what a real server logs, secrets included.
SERVER = textwrap.dedent('''
    import http.server, json, os, sys, threading, time
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1]); key = args[args.index("--api-key") + 1]
    metrics = open(os.environ["FAKE_METRICS"], "rb").read()

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a):
            pass
        def do_GET(self):
            path = self.path.split("?", 1)[0].rstrip("/")
            code, body = 200, b""
            if path == "/metrics":
                body = metrics
            elif path == "/version":
                body = b'{"version": "0.32.0"}'
            elif path == "/v1/models":
                if self.headers.get("Authorization") != "Bearer " + key:
                    code, body = 401, b'{"error": "Unauthorized"}'
                else:
                    body = json.dumps({"object": "list", "data": [{"id": "/tmp/tiny", "object": "model",
                                                                   "max_model_len": 2048}]}).encode()
            elif path != "/health":
                code, body = 404, b'{"detail": "Not Found"}'
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    hf = os.environ["HF_TOKEN"]
    print(f"INFO 12-02 07:00:01 [utils.py:253] non-default args: {{'model_tag': '/tmp/tiny', "
          f"'host': '127.0.0.1', 'port': {port}, 'api_key': ['{key}'], 'hf_token': '{hf}'}}", flush=True)
    print(f"DEBUG 12-02 07:00:02 [env] HF_TOKEN={hf} VLLM_API_KEY={key}", flush=True)
    print(f"INFO 12-02 07:00:03 [launcher.py:44] Route: /v1/models, Authorization: Bearer {os.environ['FAKE_BEARER']}",
          flush=True)
    print("INFO:     Started server process [%d]" % os.getpid(), flush=True)
    print("INFO:     Application startup complete.", flush=True)
    i = 0
    def vtop_test_serving_loop():
        global i
        while True:
            i += 1
            print(f"INFO 12-02 07:01:{i % 60:02d} [logger.py:39] Received request cmpl-{i}: prompt: "
                  f"'{os.environ['FAKE_PROMPT']}', params: SamplingParams(n=1, max_tokens=16), "
                  f"prompt_token_ids: [1, 2, 3], lora_request: None.", flush=True)
            time.sleep(0.5)
    vtop_test_serving_loop()
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["visible", "hidden"])
def keyed_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes], bool]]:
    """The server process: (url, its log path, the Popen, whether vtop can see it is vLLM).

    visible: titled as vLLM (``python .../vllm serve /tmp/tiny --api-key KEY ...``): discovery
    finds it, reads its flags (the key among them) and py-spy can dump it. hidden: the same
    program under another name (as a server in a container, or another user's, is to vtop):
    vtop knows neither the process nor the key, and must still scrub by pattern."""
    visible = request.param == "visible"
    bindir = tmp_path / "srv" / "bin"
    bindir.mkdir(parents=True)
    script = bindir / ("vllm" if visible else "model-server")
    script.write_text(SERVER)
    log = tmp_path / "srv" / "serve.log"
    port = _free_port()
    env = {**os.environ, "HF_TOKEN": HF, "FAKE_METRICS": str(METRICS), "FAKE_BEARER": BEARER,
           "FAKE_PROMPT": PROMPT, "VLLM_API_KEY": ""}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), "serve", "/tmp/tiny", "--host", "127.0.0.1",
                                 "--port", str(port), "--api-key", KEY], stdout=out, stderr=subprocess.STDOUT,
                                env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline_tries = int(GUARD_S / 0.05)
        for _ in range(deadline_tries):  # listening (an event: the connect succeeds), hang guard only
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise AssertionError(f"the fake server ended: {log.read_text()}") from None
                time.sleep(0.05)
        yield url, log, proc, visible
    finally:
        proc.kill()
        proc.wait()


def _written(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _content(p: Path) -> bytes:
    data = p.read_bytes()
    if data[:2] == b"\x1f\x8b":  # a gzip recording: what is inside counts
        data = gzip.decompress(data)
    return data


@pytest.mark.skipif(not PYSPY.exists(), reason="py-spy not installed in this venv")
async def test_the_keys_s_d_s_and_once_json_write_no_secret(
        keyed_server: tuple[str, Path, subprocess.Popen[bytes], bool], tmp_path: Path) -> None:
    url, log, proc, visible = keyed_server
    out = tmp_path / "vtop-wrote"
    bundles = out / "bundles"
    bundles.mkdir(parents=True)
    rec = out / "session.jsonl.gz"
    os.environ.pop("VLLM_API_KEY", None)  # vtop is not told the key: it must find it (and hide it) itself
    app = VtopApp(Config(urls=(url,), no_gpu=True, interval=0.5, snapshot_dir=str(bundles), log=str(log),
                         record=str(rec)), hostname="t")
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        ws = app.monitor.servers[url]
        if visible:
            await wait_for(pilot, lambda: polled(app, url))  # /v1/models answered: vtop sent the key it read
            await wait_for(pilot, lambda: ws.process is not None and ws.process.pid == proc.pid)
        else:
            await wait_for(pilot, lambda: ws.last_view is not None and ws.last_view.state == "up")
        await wait_for(pilot, lambda: app.w_log.line_count > 3)  # the secret-carrying lines are on screen

        await pilot.press("s")
        await wait_for(pilot, lambda: app.last_snapshot is not None and not app._snapshot_busy)
        first = app.last_snapshot
        assert first.ok, first

        await pilot.press("d")
        if visible:
            await wait_for(pilot, lambda: isinstance(app.screen, PySpyScreen))
            screen = app.screen
            assert isinstance(screen, PySpyScreen) and screen.target.pid == proc.pid
            await wait_for(pilot, lambda: screen.result is not None, timeout=90)
            res = screen.result
            assert res is not None
            if res.kind == "permission":
                pytest.skip(res.message)
            assert res.ok, res.message
            shown = str(screen.query_one("#dump").render())
            assert "vtop_test_serving_loop" in shown  # a real dump of the server
            assert "--api-key" in (res.raw or "") and KEY not in shown  # its command line, scrubbed
            # saved into the latest bundle as it came, then once more with s
            await wait_for(pilot, lambda: len(list(Path(first.path).glob("pyspy-*.txt"))) == 1)
            await pilot.press("s")
            await wait_for(pilot, lambda: len(list(Path(first.path).glob("pyspy-*.txt"))) == 2)
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, PySpyScreen))
        else:
            await wait_for(pilot, lambda: any("no vLLM process found" in n.message for n in app._notifications))

        await pilot.press("s")
        await wait_for(pilot, lambda: app.last_snapshot is not first and app.last_snapshot is not None
                       and not app._snapshot_busy)
        second = app.last_snapshot
        assert second.ok and second.path != first.path, second
        await log_pane_settled(pilot, app)

    once = subprocess.run([sys.executable, "-m", "vtop", url, "--once", "--json", "--no-gpu", "--log", str(log),
                           "--record", str(out / "once.jsonl.gz")],
                          capture_output=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                                  if k != "VLLM_API_KEY"})
    assert once.stdout, once.stderr
    report = json.loads(once.stdout)
    assert report["servers"], report
    (out / "once.json").write_bytes(once.stdout)  # what --once --json printed, kept to be searched too

    files = _written(out)
    names = {p.name for p in files}
    assert "screen.svg" in names and "session.jsonl.gz" in names and "once.jsonl.gz" in names, names
    assert any(n.startswith("pyspy-") for n in names) is visible, names
    for p in (rec, out / "once.jsonl.gz"):
        assert b"non-default args" in _content(p) and b"Authorization" in _content(p), p  # the lines are there
    bundle_files = [p for p in files if bundles in p.parents]
    assert any(b"non-default args" in _content(p) for p in bundle_files)  # the log copy, scrubbed
    if visible:  # the command line (py-spy's header, the process in the bundle) is in there, scrubbed
        assert any(b"--api-key" in _content(p) for p in bundle_files)
    for p in files:
        leaks = [s for s in PLANTED if s.encode() in _content(p)]
        assert not leaks, (str(p.relative_to(out)), leaks)
        if p.name != "once.json":  # the one file this test wrote (vtop printed it)
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, (p, oct(p.stat().st_mode))
    for d in (Path(first.path), Path(second.path)):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    grep = shutil.which("grep")
    if grep is not None:  # the proof, literally: grep -r over everything vtop wrote
        r = subprocess.run([grep, "-r", "-l", "-a", "-F", *(a for s in PLANTED for a in ("-e", s)), str(out)],
                           capture_output=True, text=True)
        assert r.returncode == 1 and not r.stdout, r.stdout
