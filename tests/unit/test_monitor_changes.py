"""What a round tells the faces changed (``Monitor.take_changes``): only what did.

Each change the screen is told of costs it a repaint, and ALERTS a refit of every panel
(``VtopApp._fit``). With no alert since vtop started, every round said ALERTS changed and
recorded an empty list of alerts: the quiet screen refitted itself every second, and a
recording of a quiet hour held 3,600 empty alert lines."""

from __future__ import annotations

from typing import Any

from vtop.clock import FakeClock
from vtop.config import Config
from vtop.core.rules import Thresholds
from vtop.core.rules.alert import Alert
from vtop.monitor.monitor import ALERTS, Monitor
from vtop.sources.recording.record import Recorder, read


class _Rules:
    """A diagnoser that returns what the test says (the monitor's bookkeeping is under test, not the rules)."""

    def __init__(self) -> None:
        self.now: list[Alert] = []
        self.in_flight: dict[str, Any] = {}
        self.thresholds = Thresholds()  # a seek makes a new diagnoser with the same thresholds

    def update(self, _evidence: Any) -> list[Alert]:
        return list(self.now)


def _monitor(tmp_path: Any) -> tuple[Monitor, _Rules, FakeClock, Recorder]:
    clock = FakeClock()
    rec = Recorder(tmp_path / "r.jsonl")
    m = Monitor(Config(no_gpu=True), clock=clock, recorder=rec, find_logs=False)
    rules = _Rules()
    m.diagnoser = rules  # type: ignore[assignment]
    return m, rules, clock, rec


def test_with_no_alert_since_the_start_only_the_first_round_says_alerts_changed(tmp_path) -> None:
    m, _rules, clock, rec = _monitor(tmp_path)
    said = []
    for _ in range(5):
        m.diagnose()
        said.append(ALERTS in m.take_changes())
        clock.advance(1.0)
    assert said == [True, False, False, False, False]
    rec.close()
    rows = [r for r in read(tmp_path / "r.jsonl") if r.get("kind") == "alerts"]
    assert [r["alerts"] for r in rows] == [[]]  # "none", once
    assert m.alert_log == []


def test_an_alert_that_comes_and_goes_is_a_change_each_time_and_a_moved_title_repaints(tmp_path) -> None:
    m, rules, clock, rec = _monitor(tmp_path)
    a = Alert("runaway", "warning", "Runaway decode on :8000: 1 request running 2m 05s", target="http://x:8000")
    a_later = Alert("runaway", "warning", "Runaway decode on :8000: 1 request running 2m 06s",
                    target="http://x:8000")
    said = []
    for now in ([], [a], [a_later], [a_later], [], []):
        rules.now = now
        m.diagnose()
        said.append(ALERTS in m.take_changes())
        clock.advance(1.0)
    # on, its age moved (repaint, same incident: not logged again), held, off, quiet
    assert said == [True, True, True, False, True, False]
    assert [len(c.alerts) for c in m.alert_log] == [1, 0]
    rec.close()
    rows = [r for r in read(tmp_path / "r.jsonl") if r.get("kind") == "alerts"]
    assert [len(r["alerts"]) for r in rows] == [0, 1, 0]


def test_a_seek_says_the_alerts_again(tmp_path) -> None:
    m, _rules, _clock, _rec = _monitor(tmp_path)
    m.diagnose()
    m.take_changes()
    m.reset()
    m.diagnoser = _Rules()  # type: ignore[assignment]  # reset made a new one
    m.take_changes()
    m.diagnose()
    assert ALERTS in m.take_changes()


def test_a_one_shot_waits_for_the_start_history_being_written_before_it_exits(tmp_path, monkeypatch) -> None:
    """The history is saved in a thread; a one-shot that ended in the round a start reached ready exited first
    and the start was lost (tests/unit/test_start_history.py's corrupt-file test failed now and then)."""
    import threading
    import time

    from vtop.faces import headless

    m, _rules, _clock, _rec = _monitor(tmp_path)
    written = threading.Event()

    def slow_save() -> None:
        time.sleep(0.3)
        written.set()

    t = threading.Thread(target=slow_save, daemon=True)
    m._writes.append(t)
    t.start()
    assert m.finish_writes(0.01) is False and not written.is_set()  # the deadline holds
    assert m.finish_writes(5.0) is True and written.is_set()
    # run_once waits for them before it reports and exits
    seen: list[bool] = []
    monkeypatch.setattr(Monitor, "finish_writes", lambda self, timeout_s=2.0: seen.append(True) or True)

    async def no_round(monitor, feed):  # type: ignore[no-untyped-def]
        return 0.0

    monkeypatch.setattr(headless, "one_round", no_round)
    with open(tmp_path / "out.json", "w") as out:
        headless.run_once(Config(no_gpu=True, urls=("http://127.0.0.1:9",)), window_s=None, as_json=True,
                          out=out, gpu_source=None)
    assert seen == [True]
