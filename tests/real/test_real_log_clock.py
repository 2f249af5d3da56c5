"""The log's clock on a real vLLM server (issue 38 item 6, issue 46 item 4).

The real vLLM CPU server started with ``TZ=Etc/GMT+8``: its log's stamps are 8 h behind vtop's clock (a
server in a container on another zone than the host: UTC beside UTC+8 is the same 8 h). The real
``python -m vtop doctor --json --log LOG URL`` (``TZ=UTC``) watches the start, and again once it is ready.
Before the log's clock was measured, it said "Startup stalled in process start: no new log line for
8h 00m" (doctor exit 1) while the lines arrived a second ago, and the start took 8 h or -8 h.

The session's server is stopped at the end (its clock is off): the next test starts its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]


def _doctor(url: str, log: Path, window: int) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "TZ": "UTC", "HOME": "/nonexistent", "XDG_CONFIG_HOME": "/nonexistent"}
    env.pop("VTOP_LOG", None)
    r = subprocess.run([sys.executable, "-m", "vtop", "doctor", "--window", str(window), "--no-gpu", "--json",
                        "--log", str(log), url], capture_output=True, text=True, timeout=window + 90, env=env,
                       cwd=str(ROOT))
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    return r.returncode, json.loads(r.stdout)


@pytest.mark.vllm_own_start  # launches its own server (its clock 8 h behind) and stops it
def test_a_real_log_stamped_8h_behind_is_no_stall_and_its_start_lasts_what_it_lasted(
        real_vllm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = real_vllm
    monkeypatch.setenv("TZ", "Etc/GMT+8")  # POSIX sign: UTC-8
    try:
        log = srv.cold_restart(extra_args=(), max_model_len=None, log_requests=True, fresh_cache=False)  # the defaults
        t0 = time.monotonic()
        # the start, watched from its first seconds (a doctor of 20 s, then another while it goes on)
        seen: list[dict[str, Any]] = []
        while time.monotonic() - t0 < 240:
            rc, rep = _doctor(srv.url, log, 20)
            seen.append(rep)
            stalls = [a["title"] for a in rep["alerts"] if a["rule"] == "startup_stall"]
            assert stalls == [], stalls
            assert rc != 1 or rep["alerts"], rep
            st = rep.get("startup") or {}
            for p in st.get("phases") or ():
                assert p["duration_s"] is None or 0 <= p["duration_s"] < 600, st
            if st.get("state") == "ready" or any(s["state"] == "up" for s in rep["servers"]):
                break
        srv.wait_health()
        rc, rep = _doctor(srv.url, log, 3)
        st = rep["startup"]
        print("startup:", json.dumps(st))
        # the log's stamps really are 8 h behind (the test is what it says)
        first = next(ln for ln in log.read_text(errors="replace").splitlines() if " INFO " in ln)
        stamp = time.strptime(f"{time.gmtime().tm_year} " + first.split(" INFO ")[1][:14], "%Y %m-%d %H:%M:%S")
        import calendar

        assert abs(calendar.timegm(stamp) - (time.time() - 8 * 3600)) < 3600, first
        assert st["state"] == "ready" and st["total_s"] is not None and 5 < st["total_s"] < 600, st
        assert not [a for a in rep["alerts"] if a["rule"] == "startup_stall"], rep["alerts"]
        assert len(seen) >= 1
    finally:
        srv.stop()
