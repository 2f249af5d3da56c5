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

from tests.metrics_server import MetricsServer
from vtop.sources.record import read
from vtop.sources.trace import truth_of

TRACES = Path(__file__).parents[1] / "corpus" / "traces"
_STAMP = re.compile(rb"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def restamped_log_until(trace: Path, t_end: float, now: float) -> bytes:
    """The trace's log as written up to wall time ``t_end``, its stamps moved so ``t_end`` is
    ``now`` (in this box's local time, as vLLM stamps its lines)."""
    data = gzip.open(trace / "log.bin.gz").read()
    size = 0
    for r in read(trace / "log-index.jsonl.gz"):
        if float(r["t"]) <= t_end:
            size = int(r["size"])
    year = time.gmtime(t_end).tm_year
    shift = now - t_end

    def sub(m: re.Match[bytes]) -> bytes:
        mon, day, hh, mi, ss = (int(x) for x in m.groups()[1:])
        import calendar

        t = calendar.timegm((year, mon, day, hh, mi, ss, 0, 0, 0)) + shift
        return m.group(1) + b" " + time.strftime("%m-%d %H:%M:%S", time.localtime(t)).encode()

    return _STAMP.sub(sub, data[:size])


def metrics_after(trace: Path, t_start: float, n: int) -> list[str]:
    rows = [r for r in read(trace / "metrics.jsonl.gz") if float(r["t"]) >= t_start and r.get("text")]
    return [str(r["text"]) for r in rows[:n]]


def test_doctor_names_an_engine_stall_that_began_before_its_window(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """engine-stall-enginecore: the engine froze at 02:08:57; doctor starts 24 s later with an 8 s
    window. The window alone sees 8 s of flat counters (the rule needs 20 s); the log's stats
    lines (a 0.0 tok/s line with 4 running, after one at 27 tok/s) say since when."""
    from vtop.cli import main

    trace = TRACES / "engine-stall-enginecore"
    truth = truth_of(trace)
    t_start = float(truth["began"]) + 24.0
    log = tmp_path / "vllm.log"
    log.write_bytes(restamped_log_until(trace, t_start, time.time()))
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    with MetricsServer(metrics_after(trace, t_start, 20), max_model_len=2048, version="0.32.0") as srv:
        rc = main(["doctor", srv.url, "--log", str(log), "--no-gpu", "--window", "8", "--json"])
    rep = json.loads(capsys.readouterr().out)
    stall = [a for a in rep["alerts"] if a["rule"] == "engine_stall"]
    assert stall and stall[0]["severity"] == "critical", rep["alerts"]
    assert rc == 2 and rep["exit_code"] == 2
    assert any("stats lines show no token" in e for e in stall[0]["evidence"])
    assert rep["window_asked_s"] == 8 and rep["log_history_s"] and rep["log_history_s"] > 30


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
