"""Requests in flight never exceed vLLM's running + waiting where those are known (issue 38 item 2): every
corpus trace played through the monitor, checked at every second of it. Without end lines in the log (V1
logs none by default) an open log entry may have ended long ago: it is "received", not "in flight".

On main before the one answer (``ddf724c``), the requests line and ``--once``'s ``requests_in_flight``
counted every open log entry (``len(LogView.inflight)``): played the same way, that broke this on 24 of
the 47 traces, every one with request logging on (1,107 "in flight" at running 4, waiting 0 on
engine-stall-enginecore; 565 at 3 on clean-sigterm-shutdown).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.corpus.score import traces
from vtop.config import Config
from vtop.monitor.player import open_recording
from vtop.sources.recording.trace import truth_of
from vtop.ui.widgets.alerts_panel import RequestsLine

ALL = traces()
_COUNT_RE = re.compile(r"requests in flight: (\d+)")


def _busy(m: Any, url: str) -> float | None:
    ws = m.servers.get(url)
    v = ws.last_view if ws is not None else None
    mt = v.metrics if v is not None and v.is_live else None
    if mt is None or mt.running is None or mt.waiting is None:
        return None
    return float(mt.running + mt.waiting)


@pytest.mark.parametrize("trace", ALL, ids=[p.name for p in ALL])
def test_requests_in_flight_never_exceed_running_plus_waiting(trace: Path) -> None:
    player = open_recording(str(trace), config=Config())
    t = player.start
    checked = 0  # seconds checked (a trace whose server never served has none)
    while t < player.end:
        t += 1.0
        player.feed_until(t)
        m = player.monitor
        for url, answer in m.in_flight.items():
            busy = _busy(m, url)
            if busy is None or answer.running is None or answer.waiting is None:
                continue
            assert busy == answer.running + answer.waiting  # the answer is of the latest poll
            listed = len(answer.requests)
            assert listed <= busy, (t - player.start, url, listed, busy, answer.requests[:3])
            assert answer.count is None or answer.count <= busy, (t - player.start, answer.count, busy)
            said = _COUNT_RE.search(RequestsLine.line(answer))
            assert said is None or int(said.group(1)) <= busy, (t - player.start, said.group(0), busy)
            checked += 1
    assert checked > 0 or truth_of(trace).get("class") == "startup_failure", "no second was checked"
