"""One pipeline: a recording played through the screen (Pilot, the replay's own keys) and
through ``vtop replay FILE --doctor --json`` (a subprocess, no Textual) gives the same
alerts at the same recorded times. Both drive vtop.monitor.Monitor; the screen steps
10 s a key press while the headless path plays the whole file at once, so a rule whose
verdict depended on how the recording is stepped, or a face that fed the monitor its own
way, would show here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from vtop.config import Config
from vtop.faces.demo import demo_path
from vtop.ui.replay import replay_app

RECORDINGS = {
    "h200-demo": demo_path(),
    "cpu-engine-death": FIXTURES / "cpu-incidents" / "engine-death-enginecore-load.jsonl.gz",
}


def doctor_timeline(path: Path) -> tuple[list[tuple[float, tuple[Any, ...]]], dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "vtop", "replay", str(path), "--doctor", "--json"],
                       capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert r.returncode in (0, 1, 2), r.stderr
    out = json.loads(r.stdout)
    rows = [(row["t"], tuple((a["rule"], a["severity"], a["target"]) for a in row["alerts"])) for row in out["timeline"]]
    return rows, out["report"]


@pytest.mark.parametrize("name", list(RECORDINGS))
async def test_screen_and_doctor_give_the_same_alerts_at_the_same_recorded_times(name: str) -> None:
    path = RECORDINGS[name]
    if not path.exists():
        pytest.fail(f"{path} is missing")
    want, report = doctor_timeline(path)
    assert want, "the recording raises alerts: an empty timeline would prove nothing"

    app = replay_app(str(path), config=Config())
    shown: list[set[str]] = []
    async with app.run_test(size=(120, 40)) as pilot:
        player = app.replay
        assert player is not None
        player.paused = True
        await pilot.pause()
        presses = 0
        while not player.ended:
            await pilot.press("right")  # +10 s through the app's own binding
            presses += 1
            shown.append({a.title for a in app.alerts})
            assert presses < 10_000
        got = [(round(c.t, 3), tuple((a.rule, a.severity, a.target) for a in c.alerts)) for c in app.monitor.alert_log]
        # what the alerts panel shows at the end is the monitor's last word
        final = {a.title for a in app.alerts}
    assert got == want
    assert final == {a["title"] for a in report["alerts"]}
    if name == "h200-demo":
        assert any(rule == "runaway" for _, alerts in want for rule, _, _ in alerts)
    if name == "cpu-engine-death":
        assert any(rule == "engine_died" and sev == "critical"
                   for _, alerts in want for rule, sev, _ in alerts), want


async def test_the_alerts_panel_follows_an_alert_whose_numbers_move() -> None:
    """The runaway's age grows while the alert stays the same rule: the panel shows the new
    age, not the one it had when the alert appeared (a real trace, the corpus's)."""
    from tests.corpus.score import TRACES
    from vtop.ui.widgets.alerts_panel import AlertsPanel

    app = replay_app(str(TRACES / "runaway-with-short-traffic"), config=Config())
    async with app.run_test(size=(120, 40)) as pilot:
        player = app.replay
        assert player is not None
        player.paused = True
        await pilot.pause()
        while not any(a.rule == "runaway" for a in app.alerts) and not player.ended:
            player.seek(player.pos + 2.0)
        first = next(a.title for a in app.alerts if a.rule == "runaway")
        player.seek(player.pos + 20.0)
        later = next(a.title for a in app.alerts if a.rule == "runaway")
        assert later != first  # the age moved on
        await pilot.pause()
        shown = str(app.query_one(AlertsPanel).render())
        assert later in shown.replace("\n", " ") or later.split(",")[0] in shown, shown
