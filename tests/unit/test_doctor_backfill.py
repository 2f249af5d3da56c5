"""`vtop doctor` reads the vLLM log's last minutes before its window (issue 24 item 7):
a live run against a server answering with a real trace's `/metrics` and a log holding that
trace's lines, stamped as if written just now; and the attach-time tail read that gives the
history before the forward read of a long log has caught up."""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path

import pytest

from tests.helpers.metrics_server import MetricsServer
from vtop.sources.recording.record import read
from vtop.sources.recording.trace import truth_of

TRACES = Path(__file__).parents[1] / "corpus" / "traces"
_STAMP = re.compile(rb"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def _restamp(data: bytes, year: int, shift: float) -> bytes:
    import calendar

    def sub(m: re.Match[bytes]) -> bytes:
        mon, day, hh, mi, ss = (int(x) for x in m.groups()[1:])
        t = calendar.timegm((year, mon, day, hh, mi, ss, 0, 0, 0)) + shift
        return m.group(1) + b" " + time.strftime("%m-%d %H:%M:%S", time.localtime(t)).encode()

    return _STAMP.sub(sub, data)


def _sizes(trace: Path) -> list[tuple[float, int]]:
    return [(float(r["t"]), int(r["size"])) for r in read(trace / "log-index.jsonl.gz")]


def restamped_log_until(trace: Path, t_end: float, now: float) -> bytes:
    """The trace's log as written up to wall time ``t_end``, its stamps moved so ``t_end`` is
    ``now`` (in this box's local time, as vLLM stamps its lines)."""
    data = gzip.open(trace / "log.bin.gz").read()
    size = max([n for t, n in _sizes(trace) if t <= t_end], default=0)
    return _restamp(data[:size], time.gmtime(t_end).tm_year, now - t_end)


class LogWriter:
    """Goes on writing the trace's log into ``path`` after ``t_start``, second by second, as
    the server did (stamps moved as :func:`restamped_log_until` moved them)."""

    def __init__(self, trace: Path, path: Path, t_start: float, now: float) -> None:
        import threading

        self.data = gzip.open(trace / "log.bin.gz").read()
        self.sizes = _sizes(trace)
        self.path, self.t_start, self.now = path, t_start, now
        self.done = max([n for t, n in self.sizes if t <= t_start], default=0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        year = time.gmtime(self.t_start).tm_year
        for t, size in self.sizes:
            if t <= self.t_start or size <= self.done:
                continue
            if self.stop.wait(max(0.0, self.now + (t - self.t_start) - time.time())):
                return
            cut = self.data.rfind(b"\n", self.done, size) + 1  # whole lines only
            if cut > self.done:
                with self.path.open("ab") as f:
                    f.write(_restamp(self.data[self.done:cut], year, self.now - self.t_start))
                self.done = cut

    def __enter__(self) -> LogWriter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def metrics_after(trace: Path, t_start: float, n: int) -> list[str]:
    rows = [r for r in read(trace / "metrics.jsonl.gz") if float(r["t"]) >= t_start and r.get("text")]
    return [str(r["text"]) for r in rows[:n]]


@pytest.mark.parametrize(("name", "after_s", "window", "mml", "rule", "code", "evidence"), [
    # the engine froze at +0; the window alone sees 8 s of flat counters (the rule needs 20 s); the
    # log's stats lines (a 0.0 tok/s line with 4 running, after one at 27 tok/s) say since when
    ("engine-stall-enginecore", 24.0, "8", 2048, "engine_stall", 2, "stats lines show no token"),
    # one request without max_tokens and no request log: every stats line since +9 s shows it
    # running and no prompt taken, so it has run 53 s by the end of the 5 s window (a stats
    # line comes 1 s into it, after the first scrape: the log and /metrics meet)
    ("runaway-alone-no-request-log", 58.0, "5", 65536, "runaway", 1, "no prompt was taken"),
    # short requests come and go every 2-5 s; the request log names the one without max_tokens, and
    # proves it unfinished: its max_tokens bucket of the first scrape (cumulative since the start)
    # has fewer finishes than the log since the startup has requests of it (vtop/core/inflight.py)
    ("runaway-with-short-traffic", 55.0, "5", 65536, "runaway", 1, "has no end or abort line"),
], ids=lambda x: x if isinstance(x, str) and "-" in x else None)
def test_doctor_names_an_incident_that_began_before_its_window(  # type: ignore[no-untyped-def]
        tmp_path: Path, capsys, monkeypatch, name, after_s, window, mml, rule, code, evidence) -> None:
    from vtop.cli import main

    trace = TRACES / name
    truth = truth_of(trace)
    t_start = float(truth["began"]) + after_s
    log = tmp_path / "vllm.log"
    now = time.time()
    log.write_bytes(restamped_log_until(trace, t_start, now))
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    with MetricsServer(metrics_after(trace, t_start, 20), max_model_len=mml, version="0.32.0") as srv, \
            LogWriter(trace, log, t_start, now):
        rc = main(["doctor", srv.url, "--log", str(log), "--no-gpu", "--window", window, "--json"])
    rep = json.loads(capsys.readouterr().out)
    got = [a for a in rep["alerts"] if a["rule"] == rule]
    assert got and got[0]["severity"] == ("critical" if code == 2 else "warning"), rep["alerts"]
    assert rc == code and rep["exit_code"] == code
    assert any(evidence in e for e in got[0]["evidence"]), got[0]["evidence"]
    assert rep["window_asked_s"] == float(window) and rep["log_history_s"] and rep["log_history_s"] > 30


def test_attach_reads_the_stats_lines_at_the_end_before_the_forward_read_gets_there(tmp_path: Path) -> None:
    """A log whose last startup is far back: the forward read (at most max_read a poll) takes
    many polls to reach the end; the history has the last stats lines at the first poll,
    and no line twice once the forward read comes by."""
    from vtop.clock import Clock
    from vtop.monitor.logwatch import LogWatch
    from vtop.sources.logtail import LogTailer

    now = time.time()
    stamp = lambda t: time.strftime("%m-%d %H:%M:%S", time.localtime(t))  # noqa: E731
    lines = [f"INFO {stamp(now - 600)} [api_server.py:1] vLLM API server version 0.10.1"]
    filler = "x" * 200
    for i in range(3000):  # ~0.7 MB of request lines, then the stats of the last minute
        lines.append(f"INFO {stamp(now - 590 + i * 0.15)} [logger.py:1] Received request cmpl-{i}: params: {filler}")
    for k in range(6):
        lines.append(f"INFO {stamp(now - 55 + 10 * k)} [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 "
                     f"tokens/s, Avg generation throughput: 50.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
                     f"GPU KV cache usage: {10 + k}.0%, Prefix cache hit rate: 0.0%")
    path = tmp_path / "big.log"
    path.write_text("\n".join(lines) + "\n")

    class Wall(Clock):
        def monotonic(self) -> float:
            return 1000.0

        def time(self) -> float:
            return now

    lw = LogWatch(LogTailer(path, max_read=64 * 1024), clock=Wall())
    v = lw.poll()
    assert v.tail.behind > 0  # the forward read is far from the end
    assert v.history is not None and [p.kv_pct for p in v.history.stats] == [10, 11, 12, 13, 14, 15]
    assert abs(v.history.stats[-1].mono - (1000.0 - 5 + 0.5)) <= 1.0  # 5 s ago, on the monitor's clock
    for _ in range(40):
        v = lw.poll()
    assert v.tail.behind == 0 and len(v.history.stats) == 6  # read twice, kept once


@pytest.mark.parametrize("name", ["runaway-alone-no-request-log"])
def test_the_history_is_bounded_to_the_last_minutes(name: str) -> None:
    from vtop.core.loghistory import LogHistory
    from vtop.core.phases import parse_line
    from vtop.sources.logtail import LineSplitter

    data = gzip.open(TRACES / name / "log.bin.gz").read()
    h = LogHistory(keep_s=60.0)
    wall = float(truth_of(TRACES / name)["ended"]) + 30
    for line in LineSplitter().feed(data):
        h.feed(parse_line(line), wall)
    v = h.snapshot(5000.0, wall)
    assert v.stats and v.stats[-1].mono - v.stats[0].mono <= 60.0 and len(v.stats) <= 7
