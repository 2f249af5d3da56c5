"""What a live vtop keeps grows with time only as far as a bound (#25 item 5).

bench/soak.py measures RSS over 30 minutes; these count the structures that kept
growing, so that a regression shows here in seconds: the monitor's log of alert
changes and each server's list of states (one entry per change, for as long as vtop
ran; a replayed H200 timeline changed the alerts about twice a minute)."""

from __future__ import annotations

from typing import Any

from tests.unit import diag_fixtures as F
from vtop.clock import FakeClock
from vtop.config import Config
from vtop.core.rules import Alert
from vtop.monitor import monitor as monitor_module
from vtop.monitor.monitor import Monitor
from vtop.sources.vllm import poll_from_error

URL = "http://127.0.0.1:8000"
KEEP_CHANGES: int = getattr(monitor_module, "KEEP_CHANGES", 1000)  # (so that the old code fails on what it kept)


class FlappingDiagnoser:
    """Says a KV warning on every other look."""

    def __init__(self) -> None:
        self.n = 0

    def update_from(self, now: float, **kw: Any) -> list[Alert]:
        self.n += 1
        return [Alert("kv_saturation", "warning", f"KV cache full ({self.n})", target=URL)] if self.n % 2 else []


def _flap(live: bool, looks: int) -> Monitor:
    clock = FakeClock()
    m = Monitor(Config(urls=(URL,)), clock=clock, live=live)
    m.diagnoser = FlappingDiagnoser()  # type: ignore[assignment]
    for _ in range(looks):
        clock.advance(0.25)
        m.diagnose()
    return m


def test_a_live_monitor_keeps_the_last_alert_changes() -> None:
    m = _flap(True, 5 * KEEP_CHANGES)
    assert KEEP_CHANGES <= len(m.alert_log) <= 2 * KEEP_CHANGES, len(m.alert_log)
    assert m.alert_log[-1].mono == m.clock.monotonic()  # the newest change is kept
    assert m.alert_log[-1].alerts == tuple(m.alerts)
    monos = [c.mono for c in m.alert_log]
    assert monos == sorted(monos) and all(b - a == 0.25 for a, b in zip(monos, monos[1:]))  # the latest, in order


def test_a_replay_keeps_every_alert_change() -> None:
    m = _flap(False, 3 * KEEP_CHANGES)
    assert len(m.alert_log) == 3 * KEEP_CHANGES


def test_a_flapping_server_keeps_the_last_states() -> None:
    clock = FakeClock()
    m = Monitor(Config(urls=(URL,)), clock=clock, live=True)
    metrics = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
    for i in range(3 * KEEP_CHANGES):
        clock.advance(1.0)
        mono = clock.monotonic()
        if i % 2:
            m.apply_server(URL, poll_from_error(URL, "refused", t=clock.time(), mono=mono))
        else:
            m.apply_server(URL, F.poll(URL, metrics, mono=mono, wall_offset=clock.time() - mono))
    h = m.servers[URL].history
    assert len(set(h)) >= 2, h[:6]  # it did flap
    assert len(h) <= 2 * KEEP_CHANGES, len(h)
    assert h[-1] == m.servers[URL].last_view.state  # type: ignore[union-attr]
