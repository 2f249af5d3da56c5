"""Issue 40 on a real recording: a compile hang whose processes vtop cannot see, named from the start history that
the same trace's earlier start gives (tests/corpus/traces/startup-stall-compile-history-noprocs).

The real vLLM 0.32.0 CPU server started twice with the same flags: the first start to ready, then a second whose
EngineCore and Worker were SIGSTOPped as its Worker logged "Warming up model for the compilation..." (torch.compile),
for 150 s, then SIGCONT. The trace has no process table (``procs.jsonl.gz`` never sampled: vtop in a container
without the host's PID namespace), so no CPU reading judges the silence and the 10-minute ceiling is never reached:
only the history does, as a vtop that watched the first start live would have kept it. The replay keeps it in memory
(never this box's ``$XDG_STATE_HOME/vtop/starts.json``). Every figure is checked against the log's own stamps or the
recorder's events.jsonl.
"""

from __future__ import annotations

import gzip
import json
import re
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from vtop.config import Config
from vtop.core.phases import Phase
from vtop.core.rules import Thresholds
from vtop.core.rules.util import dur
from vtop.monitor.player import Player, open_recording
from vtop.sources.recording.trace import truth_of
from vtop.ui.widgets.startup_panel import StartupPanel

TRACE = Path(__file__).resolve().parent / "traces" / "startup-stall-compile-history-noprocs"
STAMP = re.compile(r" (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")


@cache
def _events() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(ln) for ln in (TRACE / "events.jsonl").read_text().splitlines() if ln.strip())


def _event(what: str, k: int = 0) -> dict[str, Any]:
    return [e for e in _events() if e["what"] == what][k]


@cache
def _log_lines() -> tuple[str, ...]:
    return tuple(gzip.decompress((TRACE / "log.bin.gz").read_bytes()).decode(errors="replace").splitlines())


def _stamp(needle: str, k: int = 0) -> float:
    """The UTC time of the ``k``-th log line holding ``needle``."""
    return _time_of([ln for ln in _log_lines() if needle in ln][k])


def _time_of(line: str) -> float:
    """A log line's stamp, UTC (the year: the recording's)."""
    m = STAMP.search(line)
    assert m is not None, line
    year = datetime.fromtimestamp(_event("launch")["t"], timezone.utc).year
    mo, d, h, mi, s = map(int, m.groups())
    return datetime(year, mo, d, h, mi, s, tzinfo=timezone.utc).timestamp()


def _first_start_compile_s() -> float:
    """The first start's torch.compile in its log: from 'Loading weights took' (the weights' end) to 'Warming up
    done.' (the Worker's compile warm-up over), 19:02:54 to 19:03:03."""
    return _stamp("Warming up done.") - _stamp("Loading weights took")


def _stalls(m: Any) -> list[tuple[float, Any]]:
    return [(c.t, a) for c in m.alert_log for a in c.alerts if a.rule == "startup_stall"]


def _player() -> Player:
    return open_recording(str(TRACE), config=Config())


def test_the_trace_is_two_starts_with_no_process_table() -> None:
    truth = truth_of(TRACE)
    assert truth["class"] == "startup_stall" and truth["expect_rules"] == ["startup_stall"]
    assert not (TRACE / "procs.jsonl.gz").exists(), "the trace holds the processes: vtop would see them"
    assert [e["what"] for e in _events() if e["what"] in ("launch", "ready")] == ["launch", "ready", "launch", "ready"]
    # the second launch's flags are the first's: the same start, its history
    assert _event("launch", 0)["flags"] == _event("launch", 1)["flags"]
    # the stop came after the second start's compile began and before anything more was logged: its last line
    # before the stop is "Warming up model for the compilation...", the next one comes after the SIGCONT
    lines = _log_lines()
    i = max(n for n, ln in enumerate(lines) if "Warming up model for the compilation" in ln)
    assert _stamp("Warming up model for the compilation", 1) <= _event("sigstop")["t"]
    nxt = next(ln for ln in lines[i + 1:] if STAMP.search(ln))
    assert _time_of(nxt) >= _event("sigcont")["t"] - 1.0, nxt


def test_the_second_start_shows_the_first_as_usually_from_the_same_trace(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Played to the stop: the history is the trace's first start alone (its phase times as the replay showed them
    when it was ready, its torch.compile the log's 9 s), on the startup panel's torch.compile row; this box's history
    file is not written (that it is not read: test_h100_starts.py)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    p = _player()
    m = p.monitor
    p.feed_until(_event("ready", 0)["mono"])
    assert m.log_view is not None and m.log_view.snapshot.state == "ready"
    first = m.log_view.snapshot
    assert m.start_usual() is None  # the first start: nothing before it
    first_phases = {v.phase: v.duration_s for v in first.phases if v.phase is not Phase.READY}
    assert first_phases[Phase.TORCH_COMPILE] == pytest.approx(_first_start_compile_s(), abs=0.01)

    p.feed_until(_event("sigstop")["mono"] + 5.0)
    snap = m.log_view.snapshot
    assert snap.state == "starting" and snap.current is Phase.TORCH_COMPILE and snap.started != first.started
    u = m.start_usual()
    assert u is not None and u.starts == 1
    assert m.start_history is not None
    runs = [r for rs in m.start_history.entries.values() for r in rs]
    assert [r.started for r in runs] == [first.started]  # the trace's first start, nothing else
    for phase, s in first_phases.items():
        pu = u.of(phase)
        assert pu is not None and pu.n == 1 and pu.usual_s == s == pu.longest_s, (phase, pu, s)
    # the screen's words: the compile in progress, with what it usually takes here
    panel = StartupPanel(gpu_activity=lambda t: (None, None), usual=m.start_usual, budget=m.memory_budget)
    panel.view = m.log_view
    panel.unfolded = True
    row = next(ln for ln in panel.build().plain.splitlines() if "torch.compile" in ln)
    compile_usual = u.of(Phase.TORCH_COMPILE)
    assert compile_usual is not None and compile_usual.words() in row, row
    assert "here (1 start)" in row
    assert m.startup_extras()["usually"]["torch_compile"] == compile_usual.words()
    p.feed_until(p.end)
    assert not (tmp_path / "state").exists(), "a replay wrote this box's start history"


def test_the_hidden_compile_hang_is_named_from_the_history_in_time() -> None:
    """The hang named once the compile has been silent 5x the first start's compile (60 s at least), within the
    class's 90 s budget and long before the 10-minute ceiling; its evidence is the history, no process reading; it
    clears once the start goes on, and the second start joins the history at ready."""
    truth = truth_of(TRACE)
    th = Thresholds()
    limit = max(th.startup_history_floor_s, th.startup_history_x * _first_start_compile_s())
    assert limit < truth["should_alert_by"] - truth["began"] < th.startup_ceiling_s
    p = _player()
    m = p.play_to_end()
    hits = _stalls(m)
    assert hits, "the hang was not named"
    t, a = hits[0]
    # named at the limit of silence after the last line before the stop (the log's stamp; the replay ticks once a
    # second)
    silent_from = _stamp("Warming up model for the compilation", 1)
    assert limit <= t - silent_from <= limit + 2.0, (t - silent_from, limit)
    assert t <= truth["should_alert_by"] + 1.0, t - truth["began"]
    assert a.severity == "warning" and "stalled in torch.compile" in a.title, a.title
    ev = "\n".join(a.evidence)
    assert (f"history: torch.compile took {dur(_first_start_compile_s())} (median), "
            f"{dur(_first_start_compile_s())} at the longest, in the last 1 start of /tmp/tinyllama v0.32.0") in ev, ev
    assert f"past {th.startup_history_x:g}x that ({dur(limit)})" in ev, ev
    assert "CPU" not in ev, ev  # no process reading: the trace has none
    # the stall held until the SIGCONT and cleared after it
    ends = [c.t for c in m.alert_log if not any(x.rule == "startup_stall" for x in c.alerts)]
    assert ends and truth["ended"] <= ends[-1] <= truth["ended"] + 30.0, ends
    assert not [x for x in m.alert_log[-1].alerts if x.rule == "startup_stall"]
    assert m.log_view is not None and m.log_view.snapshot.state == "ready"
    assert m.start_history is not None and sum(len(r) for r in m.start_history.entries.values()) == 2
