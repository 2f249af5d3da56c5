"""No --log given: vtop follows the log of a vLLM server it finds, also one started after vtop."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import make_app
from vtop.sources.discovery import discover_servers
from vtop.ui.widgets.startup_panel import StartupPanel


def start_fake_vllm(tmp_path: Path, log: Path) -> subprocess.Popen[bytes]:
    """A real process that looks like `vllm serve` in the process table, its stdout a file."""
    exe = tmp_path / "vllm"
    exe.write_text("import time\nprint('INFO Starting vLLM API server', flush=True)\ntime.sleep(60)\n")
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, str(exe), "serve", "/tmp/tiny", "--port", "18765"],
                                stdout=out, stderr=subprocess.STDOUT)


def servers_of(pid: int) -> list:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [sp for sp in discover_servers() if sp.pid == pid]
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("the process never showed up as a vLLM server")


async def test_a_server_started_after_vtop_gets_its_log_followed(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    app = make_app(None, no_gpu=True)
    async with app.run_test(size=(100, 30)) as pilot:
        app.apply_procs([])  # vtop starts first: nothing to follow
        await pilot.pause()
        assert app.log_watch is None
        assert "no vLLM process on this box" in str(app.query_one(StartupPanel).render())
        proc = start_fake_vllm(tmp_path, log)
        try:
            servers = servers_of(proc.pid)
            app.apply_procs(servers)  # a later scan finds it
            await pilot.pause()
            assert app.log_watch is not None
            assert str(log) in str(app.query_one(StartupPanel).render())
            watch = app.log_watch
            app.apply_procs(servers)  # the same servers: nothing redone
            assert app.log_watch is watch
        finally:
            proc.kill()
            proc.wait()
