"""A small synthetic trace in the corpus format (``tests/corpus/FORMAT.md``), for the tests of
the trace server and the live doctor."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def write_trace(root: Path, metrics: list[tuple[float, int | None, str | None, str | None]],
                log_sizes: list[tuple[float, int]], log: bytes) -> Path:
    """A small synthetic trace: launch at mono 100 (wall 1000), rows at the given seconds."""
    root.mkdir()
    (root / "truth.json").write_text(json.dumps({"name": root.name, "class": "runaway", "expect_rules": ["runaway"],
                                                  "began": 1002.0, "should_alert_by": 1004.0}))
    (root / "events.jsonl").write_text(
        json.dumps({"t": 1000.0, "mono": 100.0, "what": "launch"}) + "\n"
        + json.dumps({"t": 1006.0, "mono": 106.0, "what": "end"}) + "\n")

    def gz(name: str, rows: list[dict[str, Any]]) -> None:
        with gzip.open(root / name, "wt") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    gz("metrics.jsonl.gz", [{"t": 1000 + o, "mono": 100 + o, "dt": 0.01, "status": s, "error": e, "text": x}
                            for o, s, e, x in metrics])
    gz("health.jsonl.gz", [{"t": 1000 + o, "mono": 100 + o, "status": s, "error": e} for o, s, e, _ in metrics])
    gz("info.jsonl.gz", [{"t": 1001.0, "mono": 101.0, "version": "9.9.9",
                          "models": {"object": "list", "data": [{"id": "m", "max_model_len": 4096}]}}])
    gz("log-index.jsonl.gz", [{"t": 1000 + o, "mono": 100 + o, "size": n} for o, n in log_sizes])
    (root / "log.bin.gz").write_bytes(gzip.compress(log))
    return root


def first_alert(path: Path, rule: str) -> tuple[Any, Any]:
    """A recording or corpus trace played through the monitor a second at a time until ``rule``'s alert is up:
    (the player, that alert, or None when it never came)."""
    from vtop.config import Config
    from vtop.monitor.player import open_recording

    p = open_recording(str(path), config=Config())
    t, alert = p.start, None
    while t < p.end and alert is None:
        t += 1.0
        p.feed_until(t)
        alert = next((a for a in p.monitor.alerts if a.rule == rule), None)
    return p, alert
