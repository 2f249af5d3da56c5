"""Fault matrix, log clock: issue 38 (item 6) and issue 46 (item 4).

The vLLM log's stamps 8 h behind vtop's clock (a container in UTC beside a host in UTC+8) gave "stalled in
torch.compile: no new log line for 8h 00m", POSSIBLE HANG and ``doctor`` exit 1, its evidence saying "the log
was read at attach" although the lines were being written while vtop watched. An old log given with ``--log``
said "no new log line for 75h". Real files, the real ``doctor``; the server's port refuses (a start in progress).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.badserver import BadServer
from vtop.cli import main

START = [
    "(APIServer pid=4242) INFO {s} [utils.py:253] non-default args: {{'model': '/models/x'}}",
    "(APIServer pid=4242) INFO {s} [model.py:733] Resolved architecture: LlamaForCausalLM",
    "(EngineCore pid=4300) INFO {s} [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/models/x'",
    "(EngineCore pid=4300) INFO {s} [gpu_model_runner.py:2600] Model loading took 2.1 GiB and 3.2 seconds",
    "(EngineCore pid=4300) INFO {s} [backends.py:548] Using cache directory: /root/.cache/vllm/torch_compile_cache",
    "(EngineCore pid=4300) INFO {s} [backends.py:559] Dynamo bytecode transform time: 4.1 s",
]


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    monkeypatch.delenv("VTOP_LOG", raising=False)


def _stamp(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(t))


def _banner(t: float) -> str:
    return f"(APIServer pid=4242) INFO {_stamp(t)} [api_server.py:1] vLLM API server version 0.32.0\n"


def _doctor(log: Path, url: str, capsys: pytest.CaptureFixture[str], writer: threading.Thread | None = None,
            window: str = "3") -> tuple[int, dict, str]:
    if writer is not None:
        writer.start()
    rc = main(["doctor", "--window", window, "--interval", "0.5", "--no-gpu", "--json", "--log", str(log), url])
    if writer is not None:
        writer.join()
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return rc, json.loads(out.out), out.out


@pytest.mark.parametrize("hours", [-8, 8])
def test_a_log_stamped_8h_off_is_news_as_it_arrives(hours: int, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "vllm.log"
    off = hours * 3600.0
    now = time.time()
    # a start written just before vtop attached (the file's modification time says so: now) ...
    log.write_text(_banner(now - 4 + off) + "".join(ln.format(s=_stamp(now - 3 + off)) + "\n" for ln in START[:4]))

    def write_on() -> None:  # ... and its next lines while doctor watches
        for ln in START[4:]:
            time.sleep(0.7)
            with log.open("a") as f:
                f.write(ln.format(s=_stamp(time.time() + off)) + "\n")

    with BadServer("refused") as srv:
        rc, rep, text = _doctor(log, srv.url, capsys, threading.Thread(target=write_on))
    stalls = [a for a in rep["alerts"] if a["rule"] == "startup_stall"]
    assert stalls == [], stalls
    assert "8h 00m" not in text and "read at attach" not in text
    assert rc != 1, rep
    startup = rep["startup"]
    assert startup["state"] == "starting"
    # the start began seconds ago on the log's own clock, not 8 h ago or in 8 h
    assert not startup.get("log_problem"), startup
    # the start's phases last seconds on the log's own clock, never 8 h
    assert all(p["duration_s"] is None or 0 <= p["duration_s"] < 60 for p in startup["phases"]), startup


def test_an_old_log_given_with_log_is_said_old(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "old.log"
    then = time.time() - 75 * 3600.0
    log.write_text(_banner(then - 5) + "".join(ln.format(s=_stamp(then)) + "\n" for ln in START))
    os.utime(log, (then, then))
    with BadServer("refused") as srv:
        rc, rep, text = _doctor(log, srv.url, capsys, window="1")
    assert [a for a in rep["alerts"] if a["rule"] == "startup_stall"] == []
    assert "no new log line" not in text
    assert any("the log's last line is 75 h old" in n for n in rep["notes"]), rep["notes"]
