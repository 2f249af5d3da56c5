"""The H200 demo recording's event timeline (``tests/fixtures/h200-demo/events.jsonl``, the GPU
machine's clock: when each phase of the run happened) and a seek to one of its moments."""

from __future__ import annotations

import json

from tests.conftest import FIXTURES

DEMO = FIXTURES / "h200-demo"


def events() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in (DEMO / "events.jsonl").read_text().splitlines():
        d = json.loads(line)
        out.setdefault(d["ev"], float(d["t"]))
    return out


EV = events()


def seek_wall(app, t: float) -> None:  # type: ignore[no-untyped-def]
    """Seek the replay to wall time ``t`` of the recording."""
    d = app.replay
    d.seek(t - d.clock.offset)
