"""A server card after its start failed (the real H100 KV-cache failure, tests/corpus/traces/h100-startup-failure-
max-model-len): its title named the dead process ("DOWN · pid 814") while its body said "no vLLM process is
running". The title follows the process: while it runs its pid, once it is gone none."""

from __future__ import annotations

import json
from pathlib import Path

from vtop.config import Config
from vtop.ui.replay import replay_app

TRACE = Path(__file__).parents[1] / "corpus" / "traces" / "h100-startup-failure-max-model-len"


async def test_the_card_of_a_failed_start_names_no_dead_pid() -> None:
    ev = {e["what"]: e for e in map(json.loads, (TRACE / "events.jsonl").read_text().splitlines())}
    app = replay_app(str(TRACE), config=Config(), name=TRACE.name)
    async with app.run_test(size=(120, 40)) as pilot:
        d = app.replay
        assert d is not None
        d.paused = True
        await pilot.pause()
        d.seek(ev["launch"]["t"] + 60.0 - d.clock.offset)  # the first start, still running (compiling)
        await pilot.pause()
        [card] = app.cards.values()
        assert f"pid {ev['launch']['pid']}" in str(card.border_title), card.border_title
        d.seek(ev["fit_launch"]["t"] - 2.0 - d.clock.offset)  # it failed and exited 3 s before
        await pilot.pause()
        ws = next(iter(app.monitor.servers.values()))
        assert ws.process is None  # the body's "no vLLM process is running" comes from this
        assert "DOWN" in str(card.border_title) and "pid" not in str(card.border_title), card.border_title
