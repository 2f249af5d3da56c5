"""``vtop doctor --window 15`` started in the middle of each incident of the corpus, replayed.

    python -m tests.corpus.window [TRACE_DIR ...]

For a trace whose truth has ``should_alert_by``, doctor is started at ``T =
should_alert_by - 15 s``: the player (:func:`vtop.monitor.player.attached_at`) hands the
monitor the log written up to ``T`` at once, as the tailer reads the log it attaches to,
and the process table of ``T``; then it plays only ``[T, should_alert_by]`` of
``/metrics``, ``/health`` and the log, as the live window would see them. The report at
the end of the window gives the exit status (``vtop.faces.headless.report``), and the rule
named. For a normal or clean-shutdown trace, the same is done at several points (every
``step`` seconds after the server is ready): each must exit 0.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.corpus.score import SLACK_S, traces

WINDOW_S = 15.0
#: classes whose trace must be named by a 15 s window started at should_alert_by - 15 s
INCIDENTS = ("runaway", "engine_stall", "kv_saturation", "engine_death", "startup_failure", "startup_stall")
QUIET = ("normal", "clean_shutdown")


@dataclass
class WindowResult:
    trace: str
    cls: str
    at_s: float
    """when doctor started, seconds after the incident began (or after the trace began)"""
    exit_code: int
    rules: list[str]
    expect: list[str]

    @property
    def named(self) -> bool:
        return any(r.split(":", 1)[-1] in self.expect for r in self.rules)


def _offset(player: Any) -> float:
    """Recorded wall minus recorded monotonic."""
    e = next(e for e in player.events if e.kind in ("server", "log", "procs") and e.t)
    return float(e.t - e.mono)


def doctor_at(path: Path, t_start: float, window_s: float = WINDOW_S, config: Any = None) -> tuple[int, list[Any]]:
    """Exit status and alerts of ``vtop doctor --window window_s`` started at wall time
    ``t_start`` of the trace (default settings, or ``config``)."""
    from vtop.config import Config
    from vtop.faces.headless import report
    from vtop.monitor.player import open_recording

    cfg = config or Config()
    full = open_recording(str(path), config=cfg)
    off = _offset(full)
    at = t_start - off
    player = open_recording(str(path), config=cfg, attach_at=at)
    player.feed_until(at + window_s + SLACK_S)
    m = player.monitor
    m.tick()
    rep = report(m, at, window_asked_s=window_s)
    return rep.exit_code, list(m.alerts)


def run_trace(path: Path, step_s: float = 30.0) -> list[WindowResult]:
    from vtop.sources.recording.trace import truth_of

    truth = truth_of(path)
    cls = str(truth.get("class"))
    expect = [str(r) for r in truth.get("expect_rules") or []]
    out: list[WindowResult] = []
    if cls in INCIDENTS and truth.get("should_alert_by") is not None:
        by = float(truth["should_alert_by"])
        if truth.get("ended") is not None:  # a runaway that reached its length just before its budget
            by = min(by, float(truth["ended"]) - 1.0)
        t0 = by - WINDOW_S
        code, alerts = doctor_at(path, t0)
        out.append(WindowResult(path.name, cls, t0 - float(truth["began"]), code,
                                [f"{a.severity}:{a.rule}" for a in alerts], expect))
    elif cls in QUIET:
        from vtop.config import Config
        from vtop.monitor.player import open_recording

        full = open_recording(str(path), config=Config())
        off = _offset(full)
        start, end = full.start + off, full.end + off
        t = start + 60.0
        while t + WINDOW_S <= end:
            code, alerts = doctor_at(path, t)
            out.append(WindowResult(path.name, cls, t - start, code, [f"{a.severity}:{a.rule}" for a in alerts],
                                    expect))
            t += step_s
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.corpus.window")
    ap.add_argument("paths", nargs="*", type=Path)
    ns = ap.parse_args(argv)
    paths = ns.paths or traces()
    print(f"{'trace':<36} {'class':<16} {'at':>6} {'exit':>4}  rules")
    for p in paths:
        for r in run_trace(p):
            rules = ", ".join(r.rules) or "-"
            print(f"{r.trace:<36} {r.cls:<16} {r.at_s:6.0f} {r.exit_code:>4}  {rules}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
