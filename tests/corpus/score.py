"""The incident scoreboard: every trace of the corpus played through vtop's monitor.

    python -m tests.corpus.score [TRACE_DIR ...] [--json] [--write-baseline]

Each trace (``tests/corpus/FORMAT.md``) is played by :class:`vtop.monitor.player.Player`
into a :class:`vtop.monitor.Monitor` with default settings, exactly as ``vtop replay
TRACE --doctor`` and the screen would, as fast as it goes. Per trace:

* **named**: the first alert of a rule the truth expects, and when (seconds after the
  incident began); **in time** when that is no later than ``should_alert_by`` (plus one
  second: the trace's sampling);
* **false alarms**: alerts of warning or critical severity of a rule the truth does not
  expect (on a normal trace: any), less the truth's ``allowed_rules`` (a warning that rightly
  foretold the incident, e.g. risky flags before a startup OOM);
* **cleared**: for an incident that ended within the trace, no expected alert is still
  up at the trace's end;
* **phase**: the startup tracker's state at the end against ``expected_phase`` (not checked
  without a log).

``--no-log`` plays every trace without its log (as vtop sees a server whose stdout is a pipe it
cannot follow); a trace whose truth says ``"log_for_vtop": false`` is always played so. There a start
failure is due by its server's exit (``server_exit``) plus one process scan, not by its log's error
line, which such a vtop never sees.

``tests/corpus/test_scoreboard.py`` runs this in the fast tier and fails when a trace
does worse than ``tests/corpus/baseline.json`` says it did.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces"
BASELINE = HERE / "baseline.json"
BAD = ("warning", "critical")
SLACK_S = 1.0
#: how often a live vtop scans the process table while a start is watched (vtop.monitor.live: 5 s): without
#: the log, a failed start is known at the first scan after its processes exited
NOLOG_SCAN_S = 5.0


@dataclass
class Score:
    name: str
    cls: str
    expect: list[str]
    named: bool
    in_time: bool
    alert_after_s: float | None
    budget_s: float | None
    false_alarms: list[str] = field(default_factory=list)
    cleared: bool | None = None
    phase: str | None = None
    phase_ok: bool | None = None
    first_title: str | None = None

    @property
    def ok(self) -> bool:
        return self.in_time and not self.false_alarms and self.cleared is not False and self.phase_ok is not False

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def traces(root: Path = TRACES) -> list[Path]:
    from vtop.sources.recording.trace import is_trace

    return sorted(p for p in root.iterdir() if is_trace(p)) if root.is_dir() else []


def score_trace(path: Path, *, with_log: bool | None = None) -> Score:
    """One trace's score; ``with_log=False``: played without its log (as vtop would see it with
    vLLM's stdout on a pipe), named ``NAME [no log]``; None: as its truth says (``log_for_vtop``)."""
    from vtop.config import Config
    from vtop.monitor.player import open_recording
    from vtop.sources.recording.trace import truth_of

    truth = truth_of(path)
    expect = [str(r) for r in truth.get("expect_rules") or []]
    # rules that are right on this trace without naming its incident (a warning that foretold it):
    # not false alarms, not the naming either
    allowed = {str(r) for r in truth.get("allowed_rules") or []}
    began, by, ended = truth.get("began"), truth.get("should_alert_by"), truth.get("ended")
    player = open_recording(str(path), config=Config(), with_log=with_log)
    no_log = with_log is False or (with_log is None and truth.get("log_for_vtop") is False)
    exit_t = truth.get("server_exit")
    if no_log and truth.get("class") == "startup_failure" and isinstance(exit_t, (int, float)) and by is not None:
        # A start that failed says so first in its log; without it the first sign is its processes gone:
        # the exit, seen at the next process scan (every NOLOG_SCAN_S while a start is watched).
        by = max(float(by), float(exit_t) + NOLOG_SCAN_S)
    m = player.play_to_end()
    first_t: float | None = None
    first_title = None
    false: list[str] = []
    seen_false: set[tuple[str, str]] = set()
    for change in m.alert_log:
        for a in change.alerts:
            if a.rule in expect and first_t is None:
                first_t, first_title = change.t, a.title
            elif (a.rule not in expect and a.rule not in allowed and a.severity in BAD
                  and (a.rule, a.severity) not in seen_false):
                seen_false.add((a.rule, a.severity))
                since = change.t - began if isinstance(began, (int, float)) else change.t - player.clock.offset
                false.append(f"{a.severity} {a.rule} at +{since:.0f}s: {a.title}")
    named = first_t is not None
    if not expect:
        in_time = True
    else:
        # A trace is sampled once a second and the rules run once a round: an alert is
        # known to the second, so one interval past should_alert_by is still in time.
        in_time = named and (by is None or first_t <= float(by) + SLACK_S)  # type: ignore[operator]
    cleared = None
    if expect and ended is not None:
        last = m.alert_log[-1].alerts if m.alert_log else ()
        cleared = not any(a.rule in expect for a in last)
    phase = None
    phase_ok = None
    lv = m.log_view
    if lv is not None:
        snap = lv.snapshot
        phase = snap.state if snap.current is None else f"{snap.state}:{snap.current.value}"
    want_phase = truth.get("expected_phase")
    if want_phase and not no_log:  # without a log there is no phase to check
        phase_ok = phase is not None and (phase == want_phase or phase.split(":")[0] == want_phase)
    return Score(
        name=path.name + (" [no log]" if with_log is False else ""), cls=str(truth.get("class")), expect=expect, named=named, in_time=bool(in_time),
        alert_after_s=round(first_t - float(began), 1) if first_t is not None and began is not None else None,
        budget_s=round(float(by) - float(began), 1) if by is not None and began is not None else None,
        false_alarms=false, cleared=cleared, phase=phase, phase_ok=phase_ok, first_title=first_title,
    )


def table(scores: list[Score]) -> str:
    lines = [f"{'trace':<40} {'class':<16} {'named':<6} {'after':>7} {'budget':>7} {'false':>5} {'cleared':<7} ok"]
    for s in scores:
        after = "-" if s.alert_after_s is None else f"{s.alert_after_s:.0f}s"
        budget = "-" if s.budget_s is None else f"{s.budget_s:.0f}s"
        cleared = "-" if s.cleared is None else ("yes" if s.cleared else "NO")
        named = ("yes" if s.in_time else "LATE") if s.named else ("-" if not s.expect else "NO")
        lines.append(f"{s.name:<40} {s.cls:<16} {named:<6} {after:>7} {budget:>7} {len(s.false_alarms):>5} "
                     f"{cleared:<7} {'ok' if s.ok else 'FAIL'}")
        for f in s.false_alarms:
            lines.append(f"    false alarm: {f}")
    incidents = [s for s in scores if s.expect]
    normal = [s for s in scores if not s.expect]
    lines.append(f"named in time: {sum(s.in_time for s in incidents)} of {len(incidents)} incidents; "
                 f"false alarms: {sum(len(s.false_alarms) for s in scores)} "
                 f"({sum(bool(s.false_alarms) for s in normal)} of {len(normal)} normal traces); "
                 f"all right: {sum(s.ok for s in scores)} of {len(scores)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.corpus.score", description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path, help="trace folders (default: every one in tests/corpus/traces)")
    ap.add_argument("--json", action="store_true", help="print the scores as JSON")
    ap.add_argument("--no-log", action="store_true",
                    help="play each trace without its log (as vtop sees a server whose stdout is a pipe)")
    ap.add_argument("--write-baseline", action="store_true", help="write tests/corpus/baseline.json from this run")
    a = ap.parse_args(argv)
    paths = a.traces or traces()
    scores = [score_trace(p, with_log=False if a.no_log else None) for p in paths]
    if a.json:
        print(json.dumps([s.row() for s in scores], indent=2))
    else:
        print(table(scores))
    if a.write_baseline:
        BASELINE.write_text(json.dumps({s.name: {"in_time": s.in_time, "false_alarms": len(s.false_alarms),
                                                  "cleared": s.cleared, "ok": s.ok} for s in scores},
                                       indent=2, sort_keys=True) + "\n")
    return 0 if all(s.ok for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
