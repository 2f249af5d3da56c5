"""The real CPU-server incidents, as vtop recorded them live (tests/real/test_real_incidents.py with
VTOP_RECORD_DIR), replayed offline through the app and the rules: the same verdicts without a server.

* runaway.jsonl.gz: vLLM 0.32.0 CPU, --max-model-len 8192 --enable-log-requests, a streaming chat
  request without max_tokens and with ignore_eos; the client hung up after the alert (threshold 30 s).
* engine-stall.jsonl.gz: 4 requests of 1500 tokens, the EngineCore SIGSTOPped, then SIGCONTed.
* normal-load.jsonl.gz: 48 requests of 64 tokens at concurrency 8.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FIXTURES
from vtop.config import Config
from vtop.core.rules import Thresholds
from vtop.ui.replay import replay_app

INC = FIXTURES / "cpu-incidents"


async def play(name: str, thresholds: Thresholds, step: float = 1.0) -> list[tuple[float, set[tuple[str, str]], object]]:
    """Replay ``name`` second by second; what the alerts were at each step."""
    app = replay_app(str(INC / name), config=Config(runaway_threshold=thresholds.runaway_s))
    app.diagnoser.thresholds = thresholds
    out = []
    async with app.run_test(size=(120, 40)) as pilot:
        d = app.replay
        d.paused = True
        await pilot.pause()
        while not d.ended:
            d.seek(d.pos + step)
            out.append((d.elapsed, {(a.rule, a.severity) for a in app.alerts}, list(app.alerts)))
    return out


async def test_runaway_recording_flags_the_runaway_and_clears() -> None:
    steps = await play("runaway.jsonl.gz", Thresholds(runaway_s=30.0))
    flagged = [i for i, (_, rules, _) in enumerate(steps) if any(r == "runaway" for r, _ in rules)]
    assert flagged, "the runaway alert never showed"
    first = flagged[0]
    alert = next(a for a in steps[first][2] if a.rule == "runaway")
    text = " ".join((alert.title, *alert.evidence))
    assert "chatcmpl-" in text and "no max_tokens" in text and "8,192" in text
    assert flagged[-1] < len(steps) - 1, "it should clear once the client hung up"
    # nothing else above info, ever
    assert not {(r, s) for _, rules, _ in steps for r, s in rules if s != "info" and r != "runaway"}


async def test_engine_stall_recording_flags_and_clears() -> None:
    steps = await play("engine-stall.jsonl.gz", Thresholds(engine_stall_s=8.0))
    flagged = [i for i, (_, rules, _) in enumerate(steps) if ("engine_stall", "critical") in rules]
    assert flagged, "the stall was not flagged"
    assert flagged[-1] < len(steps) - 1 and not any(r == "engine_stall" for r, _ in steps[-1][1])


async def test_normal_load_recording_raises_nothing_and_requests_come_and_go() -> None:
    app = replay_app(str(INC / "normal-load.jsonl.gz"), config=Config(runaway_threshold=30.0))
    app.diagnoser.thresholds = Thresholds(runaway_s=30.0, engine_stall_s=8.0)
    rules: set[tuple[str, str]] = set()
    in_flight: list[int] = []
    async with app.run_test(size=(120, 40)) as pilot:
        d = app.replay
        d.paused = True
        await pilot.pause()
        while not d.ended:
            d.seek(d.pos + 0.5)
            rules |= {(a.rule, a.severity) for a in app.alerts}
            in_flight.append(len(app.log_view.inflight) if app.log_view else 0)
        finished = len(app.log_view.recent_finished)
    assert len(in_flight) > 20
    assert not {x for x in rules if x[1] != "info"}, rules
    assert max(in_flight) >= 2 and in_flight[-1] == 0 and finished >= 8


def test_the_recordings_are_vtops_own_and_hold_every_kind() -> None:
    from vtop.sources.recording.record import load

    for name in ("runaway.jsonl.gz", "engine-stall.jsonl.gz", "normal-load.jsonl.gz"):
        header, events = load(INC / name)
        assert header["schema"] == "vtop-record" and header["version"] == 2
        kinds = {e.kind for e in events}
        assert {"server", "log", "alerts"} <= kinds, (name, kinds)
        assert Path(INC / name).stat().st_size < 100_000
