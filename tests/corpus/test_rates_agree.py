"""One rate, one number, its window said (issue 38 item 4).

The card's headline ``gen tok/s`` was a 60 s average beside a 5 s sparkline: 2.5k while the runaway
alert said 536 tok/s. Now the headline is the sparkline's rate over its window (the row's note says
"5s"), every other rate on the card says its window, and the alert says the window of its figure
("... tok/s over 10 s"). On every runaway trace of the corpus, at the first runaway alert, the card's
figure and the alert's agree within 30 % (one 5 s window inside the other's 10 s); on main the alert
said no window and the card's 60 s average was 46 % off (runaway-during-burst-queue: 528 vs 973).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.corpus.score import traces

RUNAWAY = [p for p in traces() if p.name.startswith(("runaway", "h200-runaway"))]
RATE_RE = re.compile(r"([\d,]+) tok/s over (\d+) s")


def _first_runaway(path: Path) -> tuple[float, float, object, object]:
    from vtop.config import Config
    from vtop.monitor.player import open_recording

    pl = open_recording(str(path), config=Config())
    while not pl.ended:
        pl.advance(1.0)
        for a in pl.monitor.alerts:
            if a.rule != "runaway" or a.severity not in ("warning", "critical"):
                continue
            m = RATE_RE.search(a.title)
            assert m is not None, f"the alert's rate says no window: {a.title}"
            ws = pl.monitor.servers[a.target]
            return float(m.group(1).replace(",", "")), float(m.group(2)), ws.last_view, pl.monitor
    raise AssertionError(f"{path.name}: no runaway alert")


@pytest.mark.parametrize("trace", RUNAWAY, ids=[p.name for p in RUNAWAY])
def test_the_cards_rate_and_the_alerts_agree_within_their_windows(trace: Path) -> None:
    from vtop.ui.widgets.server_panel import ServerCard, fmt_num

    alert_rate, alert_win, v, m = _first_runaway(trace)
    assert 5 <= alert_win <= 15
    card_rate = v.gen_tps_now  # type: ignore[attr-defined]
    assert card_rate is not None and abs(card_rate - alert_rate) <= 0.3 * alert_rate, (card_rate, alert_rate)
    card = ServerCard(v.url, window_s=60.0, max_gap=2.5)  # type: ignore[attr-defined]
    card.view, card.now = v, m.clock.monotonic()  # type: ignore[attr-defined]
    rows = ["".join(r[0] for r in runs) for runs in card.all_lines(120)]
    gen = next(r for r in rows if r.startswith("gen tok/s"))
    # the headline is the sparkline's rate, and the row says over how long
    assert re.search(rf"gen tok/s\s+{re.escape(fmt_num(card_rate))} ", gen) and " 5s " in gen, gen
    prompt = next(r for r in rows if "prompt " in r)
    assert re.search(r"prompt (-|\S+/s 5s)", prompt), prompt
