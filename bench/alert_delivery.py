"""Does alert delivery cost the tick anything, with receivers that hang or fail? (issue #41)

Two ``vtop watch`` faces (:class:`vtop.faces.watch.Watch`, the same monitor pipeline) run at once on one
event loop against a local server that answers with the real H200 ``/metrics`` timeline
(``tests/helpers/metrics_server.py``): one delivers to a command, a receiver that answers 200, one that
answers 500 and one that never answers; the other delivers nowhere. The server's ``/metrics`` stops
answering for a while every cycle, so the ``api_unresponsive`` incident starts and clears again and again
(each change goes to every target; the hung one holds its connections for the whole run). Prints each
face's tick durations (collect, rules, the hand-off to the senders, printing) and what the receivers got.

    .venv/bin/python bench/alert_delivery.py [--seconds 90] [--cycle 20]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.metrics_server import MetricsServer, h200_payloads
from tests.helpers.webhook_receiver import Receiver
from vtop.config import build
from vtop.faces.watch import Watch


def stats(xs: list[float]) -> str:
    ms = sorted(1000 * x for x in xs)
    if not ms:
        return "no ticks"
    return (f"{len(ms)} ticks: median {statistics.median(ms):.2f} ms, p95 {ms[int(0.95 * (len(ms) - 1))]:.2f} ms, "
            f"max {ms[-1]:.2f} ms")


async def main(seconds: float, cycle: float) -> None:
    ran = Path(tempfile.mkdtemp()) / "runs"
    env = {"XDG_CONFIG_HOME": "/nonexistent"}
    with MetricsServer(h200_payloads(100, 60)) as srv, Receiver("ok") as ok, Receiver("500") as bad, \
            Receiver("hang") as hung:
        base = {"urls": (srv.url,), "no_gpu": True, "interval": "0.5"}
        with_d = Watch(build(base | {"webhook": [f"{ok.url}/a", f"{bad.url}/b", f"{hung.url}/c"],
                                     "on_alert": f'echo "$VTOP_ALERT_EVENT" >> {ran}'}, env=env),
                       out=io.StringIO(), err=io.StringIO(), gpu_source=None)
        without = Watch(build(base, env=env), out=io.StringIO(), err=io.StringIO(), gpu_source=None)

        def short_hold(w: Watch) -> None:
            th = w.monitor.diagnoser.thresholds if w.monitor is not None else None
            if th is not None and th.alert_clear_hold_s != 2.0:
                w.monitor.diagnoser.thresholds = replace(th, alert_clear_hold_s=2.0)  # type: ignore[union-attr]

        for w in (with_d, without):
            w.on_tick.append(short_hold)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(w.run(stop)) for w in (with_d, without)]
        t0 = asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - t0 < seconds:
            srv.hang = ((asyncio.get_running_loop().time() - t0) % cycle) >= cycle / 2
            await asyncio.sleep(0.5)
        srv.hang = False
        stop.set()
        await asyncio.gather(*tasks)
        print(f"delivering to a command and 3 webhooks (200, 500, hanging): {stats(list(with_d.tick_s))}")
        print(f"delivering nowhere (same monitor, same time):              {stats(list(without.tick_s))}")
        print(f"changes: {len(with_d.events)} ({', '.join(e.event for e in with_d.events)}); 200 receiver got "
              f"{len(ok.posts)}; 500 receiver {bad.requests} requests; hung receiver held {hung.hangs}; "
              f"command ran {len(ran.read_text().splitlines()) if ran.exists() else 0} times")
        print("stderr of the delivering face:\n" + with_d.err.getvalue())


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--cycle", type=float, default=20.0)
    a = ap.parse_args()
    asyncio.run(main(a.seconds, a.cycle))
