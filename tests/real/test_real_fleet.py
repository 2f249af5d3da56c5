"""Issue 27, the real tier: a real Prometheus scraping two real vLLM CPU servers; vtop's fleet
table shows each, a runaway on one is named on its row, and the other, stopped mid-test,
turns DOWN.

Debian's ``prometheus`` 2.42 (:mod:`tests.helpers.prom_harness`) scrapes both every second (their
``instance`` labels rewritten to ``box-a:PORT`` / ``box-b:PORT``, as a fleet names its hosts).
vtop is the fleet screen itself (:class:`~vtop.ui.fleet_app.FleetApp` in Textual's test
harness) refreshing every second with ``--runaway-threshold 20s``: the real server decodes
the tiny model at 250-480 tokens/s, so the long request (``max_tokens`` 30,000 with
``ignore_eos``, on a server started with ``--max-model-len 65536`` as the other runaway tests
run it) would run 1-2 minutes (the client hangs up after 60 s): long enough for the rule's
"nothing finished" at 20 s (an 8,000-token request ended in 17 s once), not for the default
2 minutes. The second server is
started by the test (~1 min on this box) and stopped by it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.prom_harness import Prometheus, Target
from tests.real.conftest import RealVllm
from vtop.config import Config
from vtop.ui.fleet_app import FleetApp

pytestmark = pytest.mark.real

SHOTS = Path(__file__).resolve().parents[2] / "screenshots" / "live-runs"


async def _until(pilot: Any, pred: Any, timeout: float, what: str, seen: Any = None) -> float:
    t0 = time.monotonic()
    trail: list[str] = []
    while not pred():
        if seen is not None:
            line = seen()
            if not trail or trail[-1] != line:
                trail.append(line)
        if time.monotonic() - t0 > timeout:
            shown = trail if len(trail) <= 60 else [*trail[:40], "...", *trail[-20:]]
            raise AssertionError(f"{what}: not within {timeout:.0f} s; seen:\n" + "\n".join(shown))
        await pilot.pause(0.25)
    return time.monotonic() - t0


def _row_trail(f: Any, key: str) -> Any:
    def line() -> str:
        r = f.rows.get(key)
        if r is None:
            return "no row"
        st = f.monitor.diagnoser._mem.servers.get(r.url)
        mem = "" if st is None or st.last is None else (
            f" busy_since {st.busy_since} last_finish {st.last_finish_t} gen {st.last.gen} done {st.last.done}")
        return (f"{time.monotonic():.1f} {r.state} run {r.running} wait {r.waiting} gen/s {r.gen_tps} alerts {[a.rule for a in r.alerts]} "
                f"error {f.error} age {r.sample_age_s}{mem}")
    return line


@pytest.mark.vllm_server(max_model_len=65536)
async def test_fleet_over_a_real_prometheus_names_a_runaway_and_a_down_server(
        real_vllm: RealVllm, tmp_path: Path) -> None:
    a = real_vllm
    b = RealVllm(tmp_path)
    try:
        b.start()
    except Exception as e:  # noqa: BLE001 - the box may be too busy for a second server
        b.stop()
        pytest.skip(f"a second vLLM server did not start: {e}")
    ia, ib = f"box-a:{a.port}", f"box-b:{b.port}"
    try:
        with Prometheus([Target("vllm", f"127.0.0.1:{a.port}", ia), Target("vllm", f"127.0.0.1:{b.port}", ib)],
                        scrape=1.0) as prom:
            prom.wait_for("vllm:num_requests_running", 2, timeout=60)
            cfg = Config(prometheus_url=prom.url, fleet_interval=1.0, runaway_threshold=20.0, history=120.0)
            app = FleetApp(cfg)
            async with app.run_test(size=(160, 50)) as pilot:
                f = app.fleet
                await _until(pilot, lambda: len(f.rows) == 2 and f.backfilled, 60, "both instances in the table")
                texts = app.fleet_rows_text()
                assert any(ia in t for t in texts) and any(ib in t for t in texts), texts
                await _until(pilot, lambda: all(r.state == "up" for r in f.rows.values()), 30, "both UP")

                # a runaway on box-a: one long request, nothing else finishing
                # (at 250-480 tokens/s here, 30,000 tokens would run 1-2 minutes: the client hangs up after 60 s)
                fut = a.start_load(n=1, concurrency=1, max_tokens=30000, time_limit_s=60, request_timeout_s=60)
                row_a = f"vllm/{ia}"
                took = await _until(pilot, lambda: any(x.rule == "runaway" for x in f.rows[row_a].alerts), 75,
                                    "the runaway named on box-a's row", _row_trail(f, row_a))
                print(f"runaway named on the fleet row {took:.1f} s after the request was sent")
                assert any("Runaway decode" in t and ia in t for t in app.fleet_rows_text())
                assert f.rows[row_a].box is not None and "vtop" in f.rows[row_a].box
                assert not any(x.rule == "runaway" for x in f.rows[f"vllm/{ib}"].alerts)
                SHOTS.mkdir(parents=True, exist_ok=True)
                app.save_screenshot(str(SHOTS / "fleet-real-runaway.svg"))

                # box-b stopped mid-test: DOWN (up == 0 in Prometheus)
                b.stop()
                row_b = f"vllm/{ib}"
                took = await _until(pilot, lambda: f.rows[row_b].state == "down", 45, "box-b DOWN")
                print(f"box-b DOWN in the table {took:.1f} s after it was stopped")
                assert any(x.rule == "server_down" for x in f.rows[row_b].alerts)
                assert any("DOWN" in t and ib in t for t in app.fleet_rows_text())
                app.save_screenshot(str(SHOTS / "fleet-real-down.svg"))
                try:
                    await asyncio.to_thread(fut.result, 120)
                except Exception:  # noqa: BLE001 - the client's own deadline ends the request
                    pass
    finally:
        b.stop()
