"""``vtop watch`` against the real vLLM CPU server: alert delivery without Prometheus (issue #41).

The server with the default flags (shared with the other default-flag tests). Two watch faces run at
once on the same event loop (the same monitor pipeline as ``vtop watch``): one delivering to a
command, a receiver in vtop's JSON, a receiver in Slack's format, a receiver that answers 500 and a
receiver that never answers; one delivering nowhere (the baseline of the tick durations). A stall
(SIGSTOP of the EngineCore while requests run) and its recovery (SIGCONT) must give

* exactly one start and one clear of ``engine_stall`` at each good receiver and one run of the
  command each;
* the ticks going on while the receiver hangs (counted, not timed), and each bad receiver's failure
  said once;

and the tick durations of both faces are printed (the numbers of the report; not asserted).
"""

from __future__ import annotations

import asyncio
import io
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.webhook_receiver import Receiver
from vtop.config import build
from vtop.faces.watch import Watch

pytestmark = pytest.mark.real


async def until(what: str, cond: Any, timeout: float, every: float = 0.2) -> Any:
    """Wait for ``cond()`` (a hang guard, not a time bound)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = cond()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        await asyncio.sleep(every)


def stats(xs: list[float]) -> str:
    if not xs:
        return "no ticks"
    ms = sorted(1000 * x for x in xs)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    return f"{len(ms)} ticks, median {statistics.median(ms):.2f} ms, p95 {p95:.2f} ms, max {ms[-1]:.2f} ms"


async def test_watch_delivers_one_start_and_one_clear_of_a_real_stall(real_vllm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = real_vllm
    ran = tmp_path / "command-runs"
    good, slack, broken, hung = Receiver("ok"), Receiver("ok"), Receiver("500"), Receiver("hang")
    env = {"XDG_CONFIG_HOME": "/nonexistent"}
    base = {"urls": (srv.url,), "no_gpu": True, "log": str(srv.log_path)}
    cfg = build(base | {"webhook": [f"{good.url}/hook/t0ken-in-path", f"slack:{slack.url}/services/T/B/s3cr3t",
                                    f"{broken.url}/hook/br0ken", f"{hung.url}/hook/hung?token=h1dden"],
                        "on_alert": f'echo "$VTOP_ALERT_EVENT $VTOP_ALERT_RULE $VTOP_ALERT_SEVERITY" >> {ran}'},
                env=env)
    out, err = io.StringIO(), io.StringIO()
    face = Watch(cfg, out=out, err=err, gpu_source=None)
    plain = Watch(build(base, env=env), out=io.StringIO(), err=io.StringIO(), gpu_source=None)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(face.run(stop)), asyncio.create_task(plain.run(stop))]
    marks: dict[str, tuple[int, int]] = {}
    try:
        await until("the server up in both faces", lambda: all(
            w.monitor is not None and any(ws.last_view is not None and ws.last_view.state == "up"
                                          for ws in w.monitor.servers.values()) for w in (face, plain)), 120)
        t0 = face.ticks
        await until("30 quiet ticks (the baseline)", lambda: face.ticks >= t0 + 30, 120)
        marks["quiet"] = (len(face.tick_s), len(plain.tick_s))
        fut = srv.start_load(n=4, concurrency=4, max_tokens=1500)
        try:
            await until("requests running", lambda: any(
                (ws.last_view.total.running or 0) >= 1 for ws in face.monitor.servers.values()  # type: ignore[union-attr]
                if ws.last_view is not None and ws.last_view.total is not None), 60)
            srv.sigstop_engine()
            try:
                await until("the start at the receiver", lambda: ("start", "engine_stall") in good.events(), 120)
                await until("the receiver that hangs holding the start", lambda: hung.hangs >= 1, 60)
                marks["hang"] = (len(face.tick_s), len(plain.tick_s))
                held = face.ticks
                # counted, not timed: the monitor goes on while the receiver hangs (its start: 3 attempts of 5 s)
                await until("ticks while the receiver hangs", lambda: face.ticks >= held + 5, 60)
                assert hung.hangs >= 1 and not hung.posts
                assert hung.hangs >= 1 and hung.posts == []
            finally:
                srv.sigcont_engine()
            await until("the clear at the receiver", lambda: ("clear", "engine_stall") in good.events(), 180)
        finally:
            srv.sigcont_engine()
            fut.result(timeout=300)
        await until("the command's runs", lambda: ran.exists() and "clear engine_stall" in ran.read_text(), 60)
        await until("the slack receiver's clear", lambda: len(
            [p for p in slack.posts if "Engine stall" in p["json"]["text"]]) >= 2, 60)
        marks["end"] = (len(face.tick_s), len(plain.tick_s))
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for r in (good, slack, broken, hung):
            r.close()
    said = err.getvalue()
    print(out.getvalue())
    print(said)
    ticks_with, ticks_without = list(face.tick_s), list(plain.tick_s)
    q, h, e = marks["quiet"], marks["hang"], marks["end"]
    print("tick durations, delivering to 4 webhooks (one hanging, one 500) and a command:")
    print("  quiet, before the stall: " + stats(ticks_with[:q[0]]))
    print("  from the hang on: " + stats(ticks_with[h[0]:e[0]]))
    print("tick durations, the same monitor delivering nowhere:")
    print("  quiet, before the stall: " + stats(ticks_without[:q[1]]))
    print("  from the hang on: " + stats(ticks_without[h[1]:e[1]]))

    assert good.events("engine_stall") == [("start", "engine_stall"), ("clear", "engine_stall")]
    stall_texts = [p["json"]["text"] for p in slack.posts if "Engine stall" in p["json"]["text"]]
    assert len(stall_texts) == 2 and "START [CRITICAL]" in stall_texts[0] and "CLEAR" in stall_texts[1]
    runs = [ln for ln in ran.read_text().splitlines() if "engine_stall" in ln]
    assert [ln.split()[0] for ln in runs] == ["start", "clear"], runs
    start = next(p["json"] for p in good.posts if p["json"]["event"] == "start" and p["json"]["rule"] == "engine_stall")
    assert start["severity"] == "critical" and start["target"] == srv.url and start["title"].startswith("Engine stall")
    # each bad receiver's failure said once, with no secret of its URL
    fails = [ln for ln in said.splitlines() if " failed: " in ln]
    assert len([ln for ln in fails if f"{broken.url}/***" in ln]) == 1, said
    assert len([ln for ln in fails if f"{hung.url}/***" in ln]) == 1, said
    assert broken.requests >= 3  # retried
    for secret in ("t0ken", "s3cr3t", "br0ken", "h1dden"):
        assert secret not in said + out.getvalue()
    lines = [ln for ln in out.getvalue().splitlines() if "Engine stall" in ln]
    assert [ln.split()[1] for ln in lines] == ["START", "CLEAR"], lines
