"""``vtop watch``: the monitor headless until stopped, one line per change of an incident, each one
delivered off the tick (issue #41). Against a local server that answers like vLLM from real payloads
(``tests/helpers/metrics_server.py``) whose ``/metrics`` stops answering: the api_unresponsive rule's
incident starts and, once it answers again, clears; a real receiver and a real command get one
message each, and a receiver that hangs holds up neither the ticks nor the other targets."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.metrics_server import MetricsServer, h200_payloads
from tests.helpers.webhook_receiver import Receiver
from vtop.config import build
from vtop.faces.watch import Watch

ENV = {**os.environ, "XDG_CONFIG_HOME": "/nonexistent"}


async def until(what: str, cond: Any, timeout: float = 60.0) -> None:
    """Wait for ``cond()`` (a hang guard, not a time bound)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_watch_delivers_one_start_and_one_clear_and_a_hung_receiver_delays_nothing(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    with MetricsServer(h200_payloads(100, 30)) as srv, Receiver("ok") as good, Receiver("hang") as hung:
        cfg = build({"urls": (srv.url,), "no_gpu": True, "interval": "0.25", "webhook": [f"{good.url}/hook",
                     f"slack:{hung.url}/services/T/B/s3cr3t"],
                     "on_alert": f'echo "$VTOP_ALERT_EVENT $VTOP_ALERT_RULE $VTOP_ALERT_SEVERITY" >> {ran}'},
                    env={"XDG_CONFIG_HOME": "/nonexistent"})
        out, err = io.StringIO(), io.StringIO()
        face = Watch(cfg, out=out, err=err, gpu_source=None)
        for s in face.delivery.senders if face.delivery else ():
            if "slack" in s.target.label:
                s.target.deadline_s = 1.0  # type: ignore[misc]

        def shorter_hold(w: Watch) -> None:
            assert w.monitor is not None
            th = w.monitor.diagnoser.thresholds
            if th.alert_clear_hold_s != 1.0:
                w.monitor.diagnoser.thresholds = replace(th, alert_clear_hold_s=1.0)

        face.on_tick.append(shorter_hold)
        stop = asyncio.Event()
        task = asyncio.create_task(face.run(stop))
        try:
            await until("a first scrape", lambda: face.monitor is not None and any(
                ws.polls for ws in face.monitor.servers.values()))
            srv.hang = True  # /metrics accepts and never answers: api_unresponsive after 6 s
            await until("the start at the receiver", lambda: good.events("api_unresponsive"))
            await until("the hung receiver holding a request", lambda: hung.hangs >= 1)
            held_at = face.ticks
            await until("ticks while the receiver hangs", lambda: face.ticks >= held_at + 8)
            assert hung.hangs >= 1 and face.ticks >= held_at + 8  # the monitor went on while it hung
            srv.hang = False
            await until("the clear at the receiver", lambda: ("clear", "api_unresponsive") in good.events())
            await until("the command's two runs", lambda: ran.exists() and len(ran.read_text().splitlines()) >= 2)
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)
    mine = good.events("api_unresponsive")
    assert mine == [("start", "api_unresponsive"), ("clear", "api_unresponsive")]
    assert [ln.split()[:2] for ln in ran.read_text().splitlines()] == [["start", "api_unresponsive"],
                                                                      ["clear", "api_unresponsive"]]
    lines = out.getvalue().splitlines()
    print("\n".join(lines))
    assert [ln.split()[1] for ln in lines] == [e.event.upper() for e in face.events]
    assert [(e.event, e.rule) for e in face.events if e.rule == "api_unresponsive"] == mine
    said = err.getvalue()
    fails = [ln for ln in said.splitlines() if "failed" in ln]
    assert len(fails) == 1 and "slack webhook" in fails[0] and "no answer within 1 s" in fails[0], said
    assert "s3cr3t" not in said + out.getvalue()
    assert json.loads(json.dumps(good.posts[0]["json"]))["target"] == srv.url


def test_vtop_watch_runs_until_sigterm_and_says_where_alerts_go() -> None:
    with MetricsServer(h200_payloads(100, 30)) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "vtop", "watch", srv.url, "--no-gpu", "--webhook",
                                 "https://hooks.slack.com/services/T/B/s3cr3t"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=ENV)
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()  # blocks until it runs (the test's timeout guards a hang)
            assert line.startswith(f"vtop watch: watching {srv.url} every 1 s; alerts to slack webhook "
                                   "https://hooks.slack.com/***;"), line
            while srv.scrapes < 2:
                assert proc.poll() is None
                import time

                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
        rest = proc.stderr.read()
    assert rc == 0 and "Traceback" not in rest and "s3cr3t" not in line + rest, rest
