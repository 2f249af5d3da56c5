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

from tests.helpers.real import Runaway, ShortTraffic

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
            r = _doctor(srv)
            real_age = time.monotonic() - t0
            assert ra.finish is None and ra.error is None, (ra.finish, ra.error)
        finished = len(short.finished)
    _named(r, ra.client, "running", real_age)
    assert finished >= 8, f"only {finished} short requests finished: the traffic was not concurrent"
    assert not short.failed, short.failed[:3]


def _doctor(srv: Any) -> subprocess.CompletedProcess[str]:
    """The real ``vtop doctor --window 15 --json`` on the server, default settings."""
    cmd = [sys.executable, "-m", "vtop", "doctor", "--window", str(WINDOW_S), "--json", srv.url,
           "--log", str(srv.log_path), "--no-gpu"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=WINDOW_S + 60, cwd=ROOT)


def _named(r: subprocess.CompletedProcess[str], client_addr: tuple[str, int], how: str, real_age: float) -> dict[str, Any]:
    """The doctor's runaway alert (warning or worse, exit 1 or 2) naming the client, with an age ``how``
    ("running" or "in flight") of at least DOCTOR_AT_S and at most the request's real age."""
    rep = json.loads(r.stdout)
    alerts = rep.get("alerts") or []
    print("doctor:", r.returncode, json.dumps([(a["rule"], a["severity"], a["title"]) for a in alerts]))
    hit = [a for a in alerts if a["rule"] == "runaway" and a["severity"] in ("warning", "critical")]
    assert hit and r.returncode in (1, 2), (r.returncode, alerts, r.stderr[-500:])
    client = f"{client_addr[0]}:{client_addr[1]}"
    assert f"(client {client})" in hit[0]["title"], hit[0]["title"]
    m = re.search(how + r" at least (?:(\d+)m )?(\d+)s", hit[0]["title"])
    assert m is not None, hit[0]["title"]
    age = 60 * int(m.group(1) or 0) + int(m.group(2))
    assert DOCTOR_AT_S <= age <= real_age + 1, (age, real_age)
    return hit[0]


class NonStreamRunaway:
    """One chat request without max_tokens and without ``"stream": true`` (ignore_eos), on a plain socket:
    vLLM sends nothing of its answer until the request ends, so the connection only shows the request.
    ``client`` is the socket's own address (its port is what vtop must name); closing it aborts the
    request in vLLM."""

    def __init__(self, srv: Any) -> None:
        import socket
        from urllib.parse import urlsplit

        u = urlsplit(srv.url)
        body = json.dumps({"model": srv.model, "ignore_eos": True, "temperature": 0.8,
                           "messages": [{"role": "user", "content": "Write a very long essay about the sea."}]})
        self.req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode()
        self.sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=5)
        addr = self.sock.getsockname()
        self.client = (str(addr[0]), int(addr[1]))

    def __enter__(self) -> NonStreamRunaway:
        self.sock.sendall(self.req)
        return self

    def answered(self) -> bool:
        """Whether any byte of the answer came (the request ended or failed)."""
        self.sock.setblocking(False)
        try:
            return bool(self.sock.recv(1, 0x2))  # MSG_PEEK: leave it there
        except BlockingIOError:
            return False
        finally:
            self.sock.setblocking(True)

    def __exit__(self, *exc: object) -> None:
        self.sock.close()  # vLLM aborts the request when its client hangs up


@pytest.mark.vllm_server(max_model_len=65536, log_requests=False)
def test_doctor_window_names_a_non_streaming_runaway_by_its_silent_connection(real_vllm: Any) -> None:
    """The same, for a client that did not ask for a stream: nothing of the answer moves on its connection,
    only the request sits there with no byte sent since it came (vtop/core/conns.py). Named as a request in
    flight, with its client's address, by the real doctor 40 s in (not named at all before vtop read a
    connection with no answer yet: only streaming answers counted)."""
    srv = real_vllm
    with ShortTraffic(srv) as short:
        time.sleep(6.0)
        with NonStreamRunaway(srv) as ra:
            t0 = time.monotonic()
            while time.monotonic() - t0 < DOCTOR_AT_S:
                assert not ra.answered(), "the request ended before the doctor ran"
                time.sleep(0.5)
            r = _doctor(srv)
            real_age = time.monotonic() - t0
            assert not ra.answered(), "the request ended during the doctor's window"
        finished = len(short.finished)
    hit = _named(r, ra.client, "in flight", real_age)
    assert any("no byte of its answer" in e for e in hit["evidence"]), hit["evidence"]
    assert finished >= 8, f"only {finished} short requests finished: the traffic was not concurrent"
    assert not short.failed, short.failed[:3]
