"""Issue 24: ``vtop doctor --window 15`` names a runaway among short requests with request logging
OFF (vLLM's default), on the real vLLM CPU server, by the kernel's counters of its connections.

Nothing else in a 15 s window can: short requests come and go, so ``/metrics`` shows requests
running and finishing, and the log's stats lines show prompts taken every 10 s. The streaming
answer on the runaway's own connection has been flowing since its request came, which the
kernel says (vtop/sources/sockets.py). The doctor is the real CLI in a subprocess, started 40 s
after the request was sent, with default settings; it must name the runaway (warning or worse,
exit 1 or 2), name the runaway's client address (the port its HTTP client used, read from
httpcore's ``network_stream``), and claim an age no larger than the request's real one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.real.test_real_incidents import Runaway
from tests.real.test_real_runaway_default import ShortTraffic

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
DOCTOR_AT_S = 40.0
WINDOW_S = 15


@pytest.mark.vllm_server(max_model_len=65536, log_requests=False)
def test_doctor_window_names_a_runaway_by_its_connection_without_request_logging(real_vllm: Any) -> None:
    srv = real_vllm
    with ShortTraffic(srv) as short:
        time.sleep(6.0)  # the short traffic is under way first
        with Runaway(srv) as ra:
            t0 = time.monotonic()
            while time.monotonic() - t0 < DOCTOR_AT_S:
                assert ra.finish is None and ra.error is None, (ra.finish, ra.error)
                time.sleep(0.5)
            assert ra.client is not None and ra.chunks > 0
            cmd = [sys.executable, "-m", "vtop", "doctor", "--window", str(WINDOW_S), "--json", srv.url,
                   "--log", str(srv.log_path), "--no-gpu"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=WINDOW_S + 60, cwd=ROOT)
            real_age = time.monotonic() - t0
            assert ra.finish is None and ra.error is None, (ra.finish, ra.error)
        finished = len(short.finished)
    rep = json.loads(r.stdout)
    alerts = rep.get("alerts") or []
    print("doctor:", r.returncode, json.dumps([(a["rule"], a["severity"], a["title"]) for a in alerts]))
    hit = [a for a in alerts if a["rule"] == "runaway" and a["severity"] in ("warning", "critical")]
    assert hit and r.returncode in (1, 2), (r.returncode, alerts, r.stderr[-500:])
    client = f"{ra.client[0]}:{ra.client[1]}"
    assert f"(client {client})" in hit[0]["title"], hit[0]["title"]
    m = re.search(r"running at least (?:(\d+)m )?(\d+)s", hit[0]["title"])
    assert m is not None, hit[0]["title"]
    age = 60 * int(m.group(1) or 0) + int(m.group(2))
    assert DOCTOR_AT_S <= age <= real_age + 1, (age, real_age)
    assert finished >= 8, f"only {finished} short requests finished: the traffic was not concurrent"
    assert not short.failed, short.failed[:3]
