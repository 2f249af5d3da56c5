"""A password in a server's URL, and ``--api-key`` on a command line (issue #46 item 1).

``vtop --once http://user:hunter2@host:8000`` printed the password in the text report, in ``--json``
and in the ``--record`` file. The URL is now split where URLs enter (``vtop.config``): every face gets
``http://user:***@host:8000`` and only the HTTP client gets the credentials (``Authorization: Basic``).
The server here is behind such a proxy: it answers 401 to a request without them, so a card that says
UP proves they were sent. Then every output and every file vtop wrote is searched for the password:
the text report, ``--json``, ``doctor``, the recordings, the screen (its SVG), the snapshot bundle, the
exporter's ``/metrics``, stderr, and a bad URL's error line.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.badserver import BadServer
from tests.helpers.pilot import wait_for
from vtop.cli import main
from vtop.config import build

PW = "hunter2-url-passw0rd-4646"
USER = "ops"


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    for k in ("VTOP_INTERVAL", "VTOP_NO_GPU", "VTOP_SIMULATE_GPUS", "VTOP_URLS", "VTOP_LOG", "VLLM_API_KEY",
              "VTOP_API_KEY"):
        monkeypatch.delenv(k, raising=False)


def _content(p: Path) -> bytes:
    data = p.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _pw_url(srv: BadServer) -> str:
    return f"http://{USER}:{PW}@127.0.0.1:{srv.port}"


async def _exporter_text(cfg_flags: dict[str, object]) -> str:
    """``vtop export`` in-process: its /metrics once the server has been polled."""
    from vtop.faces.exporter import serve

    cfg = build(cfg_flags, env={})
    stop = asyncio.Event()
    ready: dict[str, object] = {}
    task = asyncio.get_running_loop().create_task(
        serve(cfg, "127.0.0.1", 0, out=open("/dev/null", "w"), gpu_source=None, stop=stop,  # noqa: SIM115
              on_ready=lambda http, mon: ready.update(http=http, mon=mon)))
    try:
        for _ in range(1200):  # hang guard only (60 s): waits for the first poll, an event
            mon = ready.get("mon")
            if mon is not None and any(ws.polls for ws in mon.servers.values()):  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.05)
        http = ready["http"]
        url = f"http://127.0.0.1:{http.port}/metrics"  # type: ignore[attr-defined]
        return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read().decode())
    finally:
        stop.set()
        await task


async def test_a_password_in_a_url_appears_in_nothing_vtop_prints_or_writes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "vtop-wrote"
    (out / "bundles").mkdir(parents=True)
    with BadServer("ok", basic_auth=f"{USER}:{PW}") as srv:
        url = _pw_url(srv)
        printed: dict[str, str] = {}
        for name, argv in (
            ("once.txt", ["--once", url, "--no-gpu", "--record", str(out / "once.jsonl.gz")]),
            ("once.json", ["--once", "--json", url, "--no-gpu", "--record", str(out / "once-json.jsonl")]),
            ("doctor.txt", ["doctor", "--window", "1", "--interval", "0.5", url, "--no-gpu",
                            "--record", str(out / "doctor.jsonl")]),
        ):
            rc = await asyncio.to_thread(main, argv)
            cap = capsys.readouterr()
            printed[name] = cap.out
            (out / name).write_text(cap.out + cap.err)
            assert rc == 0, (name, cap.out, cap.err)  # UP: the credentials reached the server
        assert f"{USER}:***@127.0.0.1:{srv.port}" in printed["once.txt"], printed["once.txt"]
        assert json.loads(printed["once.json"])["servers"][0]["url"] == f"http://{USER}:***@127.0.0.1:{srv.port}"

        # the screen, the recording it makes and the bundle of the s key
        from vtop.ui.app import VtopApp

        cfg = build({"urls": (url,), "no_gpu": True, "interval": 0.5, "snapshot_dir": str(out / "bundles"),
                     "record": str(out / "screen.jsonl.gz")}, env={})
        app = VtopApp(cfg, hostname="t")
        async with app.run_test(size=(120, 40)) as pilot:
            ws = next(iter(app.monitor.servers.values()))
            await wait_for(pilot, lambda: ws.last_view is not None and ws.last_view.state == "up")
            (out / "screen.svg").write_text(app.export_screenshot())
            await pilot.press("s")
            await wait_for(pilot, lambda: app.last_snapshot is not None and not app._snapshot_busy)
            assert app.last_snapshot.ok, app.last_snapshot

        (out / "exporter.txt").write_text(await _exporter_text({"urls": (url,), "no_gpu": True, "interval": 0.5}))
        assert srv.authorized > 0 and srv.refused_auth == 0, (srv.authorized, srv.refused_auth)

    # a URL vtop cannot poll: the error line masks the password too
    with pytest.raises(SystemExit) as exc:
        main(["--once", f"http://{USER}:{PW}@[::1", "--no-gpu"])
    cap = capsys.readouterr()
    (out / "bad-url.txt").write_text(cap.out + cap.err)
    assert exc.value.code == 3 and "not a URL vtop can poll" in cap.err, cap.err

    files = sorted(p for p in out.rglob("*") if p.is_file())
    names = {p.name for p in files}
    assert {"once.jsonl.gz", "once-json.jsonl", "doctor.jsonl", "screen.jsonl.gz", "screen.svg",
            "exporter.txt"} <= names, names
    assert any(p.name.startswith("metrics") for p in files), names  # the bundle's /metrics copy came (with auth)
    assert f"{USER}:***@" in (out / "exporter.txt").read_text()
    for p in files:
        assert PW.encode() not in _content(p), p.relative_to(out)
    r = subprocess.run(["grep", "-r", "-l", "-a", "-F", PW, str(out)], capture_output=True, text=True)
    assert r.returncode == 1 and not r.stdout, r.stdout  # the proof, literally: grep -r


@pytest.mark.parametrize("argv", [
    ["--once", "--api-key", "S3cr3t-cli-key", "http://127.0.0.1:9"],
    ["doctor", "--api-key=S3cr3t-cli-key", "http://127.0.0.1:9"],
    ["export", "--api-key", "S3cr3t-cli-key"],
    ["web", "--api-key", "S3cr3t-cli-key"],
])
def test_api_key_on_the_command_line_is_refused_with_one_line(argv: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "vtop", *argv], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "XDG_CONFIG_HOME": "/cfg"})
    assert r.returncode == 3, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and not r.stdout, r.stderr
    assert "--api-key" in lines[0] and "VLLM_API_KEY" in lines[0] and "/cfg/vtop/config.toml" in lines[0], lines[0]
    assert "S3cr3t-cli-key" not in r.stderr
