"""Does the replay of a trace name its incident when a live vtop would? Both, side by side.

    python -m tools.corpus.live_vs_replay TRACE_DIR [--before S] [--after S] [--json]

The scoreboard (``tests/corpus/score.py``) plays a trace through the monitor at once; the
trace reader cuts each recorded full ``/metrics`` down to what the live scraper would have
asked for at that second (``vtop.sources.vllm.ScrapePlan``). This checks that claim against a
live vtop: the trace is served in real time by :mod:`tests.corpus.serve_trace` (``/metrics/?
name[]=...`` filtered as prometheus_client does, the log growing as recorded), from
``--before`` seconds before the incident began to ``--after`` seconds after it, and vtop's own
pipeline (``LiveFeed`` -> ``Monitor``, default settings, no GPU, no process scan: there is no
vLLM process behind the port) watches it: the scraper, its restricted scrapes and histogram
cadence, the log tailer, the rules, as the screen runs them. Printed: the trace second each of
the two first named the incident (an alert of an expected rule, warning or worse), and the
replay's over the same stretch.

Real time: ``before + after`` seconds per trace (about 100 s for a runaway); not in any tier.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.corpus.serve_trace import TraceServer

BAD = ("warning", "critical")


def replay_first(trace: Path, expect: list[str]) -> float | None:
    """Seconds after ``began`` the replay first names the incident (None: never)."""
    from vtop.config import Config
    from vtop.monitor.player import open_recording
    from vtop.sources.recording.trace import truth_of

    began = float(truth_of(trace)["began"])
    m = open_recording(str(trace), config=Config()).play_to_end()
    for change in m.alert_log:
        if any(a.rule in expect and a.severity in BAD for a in change.alerts):
            return change.t - began
    return None


async def live_first(trace: Path, expect: list[str], before: float, after: float) -> dict[str, Any]:
    """Serve ``trace`` from ``before`` s before its incident began and watch it live."""
    from vtop.config import Config
    from vtop.monitor.live import LiveFeed
    from vtop.monitor.logwatch import LogWatch
    from vtop.monitor.monitor import Monitor

    srv = TraceServer(trace)
    began = srv.timeline.began
    if began is None:
        raise SystemExit(f"{trace}: the truth has no 'began'")
    srv = TraceServer(trace, start_at=max(0.0, began - before))
    srv.start()
    first: float | None = None
    seen: list[str] = []
    try:
        cfg = dataclasses.replace(Config(), urls=(srv.url,), log=str(srv.log_path), no_gpu=True)
        monitor = Monitor(cfg)
        monitor.log_watch = LogWatch.open(str(srv.log_path), clock=monitor.clock,
                                          stall_threshold_s=cfg.stall_threshold)
        feed = LiveFeed(monitor, gpu_source=None, discover=None)
        feed.start()
        try:
            while srv.offset() < began + after:
                await asyncio.sleep(cfg.interval)
                feed.collect()
                monitor.tick()
                for a in monitor.alerts:
                    if a.severity in BAD:
                        tag = f"{a.severity} {a.rule}"
                        if tag not in seen:
                            seen.append(tag)
                        if a.rule in expect and first is None:
                            first = srv.offset() - began
                            print(f"  live: {a.severity} {a.rule} at +{first:.1f} s: {a.title}", flush=True)
            sc = feed.scrapers.get(srv.url)
            restricted = sc.restricted_polls if sc is not None else None
        finally:
            await feed.aclose()
    finally:
        srv.stop()
    return {"live_s": None if first is None else round(first, 1), "live_alerts": seen,
            "restricted_polls": restricted}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.corpus.live_vs_replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--before", type=float, default=20.0, help="seconds of the trace played before the incident began")
    ap.add_argument("--after", type=float, default=75.0, help="seconds played after it began")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from vtop.sources.recording.trace import truth_of

    truth = truth_of(a.trace)
    expect = [str(r) for r in truth.get("expect_rules") or []]
    t0 = time.monotonic()
    row: dict[str, Any] = {"trace": a.trace.name, "expect": expect}
    row["replay_s"] = None if (r := replay_first(a.trace, expect)) is None else round(r, 1)
    row.update(asyncio.run(live_first(a.trace, expect, a.before, a.after)))
    row["budget_s"] = round(float(truth["should_alert_by"]) - float(truth["began"]), 1)
    row["took_s"] = round(time.monotonic() - t0, 1)
    if a.json:
        print(json.dumps(row))
    else:
        print(f"{row['trace']}: replay named it at {row['replay_s']} s, live at {row['live_s']} s "
              f"(budget {row['budget_s']} s; live alerts {row['live_alerts']}; "
              f"restricted polls {row['restricted_polls']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
