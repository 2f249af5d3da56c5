"""Deciding without the log (issue 49): a frozen engine dated by its connections' silence, a start
judged by its processes, and a finding pending at the end of a short window (injected clocks; the
doctor test runs the real CLI against a local /metrics server)."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.helpers import diag_fixtures as F
from tests.helpers.metrics_server import MetricsServer
from vtop.core.requests.conns import SILENT_S, ConnTracker
from vtop.core.rules import Alert, Thresholds
from vtop.sources.vllm import poll_from_error

ROOT = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:8011"
LOAD = "cpu-0.32.0-metrics-load.txt"  # a real CPU server's /metrics with running 8


def conn(remote: str, sent: float | None, recv: float | None, acked: int | None = 100, rcvd: int | None = 200) -> Any:
    return SimpleNamespace(local="127.0.0.1:8011", remote=remote, last_sent_s=sent, last_recv_s=recv,
                           bytes_acked=acked, bytes_received=rcvd)


def streams(n: int, silent_s: float, *, req_s: float = 90.0) -> list[Any]:
    """``n`` answers that began (data sent after the request) and have sent nothing for ``silent_s`` + i."""
    return [conn(f"127.0.0.1:{40000 + i}", silent_s + i, req_s + i) for i in range(n)]


def scrape() -> Any:
    """A /metrics scrape on a kept-alive connection: asked 0.3 s ago, answered at once."""
    return conn("127.0.0.1:50000", 0.29, 0.3)


# --------------------------------------------------------------------------- the connections' silence


def test_silence_is_every_begun_answer_silent_dated_by_the_youngest() -> None:
    tr = ConnTracker()
    tr.feed(1000.0, [*streams(3, 30.0), scrape()])
    sil = tr.silence(1000.0)
    assert sil is not None
    assert (sil.streams, sil.pending) == (3, 0)
    assert sil.since == 1000.0 - 30.0 and sil.oldest == 1000.0 - 32.0  # the youngest silence dates it
    # stale: the read says nothing about a minute later
    assert tr.silence(1000.0 + 60.0) is None


def test_no_silence_while_an_answer_flows_or_one_sent_a_byte_moments_ago() -> None:
    tr = ConnTracker()
    live = conn("127.0.0.1:41000", 0.2, 50.0, acked=1000)
    tr.feed(1000.0, [*streams(2, 30.0), live])
    assert tr.silence(1000.0) is None  # an answer to a 50 s old request sent a byte 0.2 s ago
    # a silence shorter than a kept-alive connection's close (uvicorn: 5 s) is no evidence
    tr2 = ConnTracker()
    tr2.feed(1000.0, streams(3, SILENT_S - 2.0))
    assert tr2.silence(1000.0) is None


# --------------------------------------------------------------------------- the engine stall, no log


def frozen(seconds: int, conns: list[Any] | None) -> tuple[F.Session, list[list[Alert]]]:
    """The real payload with running 8 scraped every second (nothing moves), no log; the connections
    read at the first second and every 10 s after, as the live reader does."""
    m = F.fixture_metrics(LOAD)
    ses = F.Session(process=F.cpu_process(), url=URL)
    tr = ConnTracker()
    out = []
    for i in range(seconds):
        now = F.R.BASE + i
        ses.metrics(m, mono=now, max_model_len=2048, version="0.32.0")
        kw: dict[str, Any] = {"log_target": None}
        if conns is not None:
            if i % 10 == 0:
                tr.feed(now, [SimpleNamespace(**{**vars(c), "last_sent_s": c.last_sent_s + i,
                                                 "last_recv_s": c.last_recv_s + i}) for c in conns])
            kw["conns"] = {URL: tr}
        out.append(ses.tick(**kw))
    return ses, out


def test_a_stall_before_vtop_looked_is_dated_by_the_connections() -> None:
    """Eight streams silent 30 s when vtop first looks, running 8, counters flat: a 15 s window names
    the stall (45 s), dated by the connections. Without them, the same window names nothing."""
    ses, out = frozen(16, streams(8, 30.0))
    got = [a for a in out[-1] if a.rule == "engine_stall"]
    assert got, out[-1]
    a = got[0]
    assert a.severity == "critical"
    assert "no token for 45s" in a.title, a.title
    ev = "\n".join(a.evidence)
    assert "dated by the connections" in ev
    assert "8 answers in flight on its connections got no byte for 45s" in ev
    # the first tick already knew: the stall is older than the threshold from the first look on
    assert any(x.rule == "engine_stall" for x in out[0])

    ses2, out2 = frozen(16, None)
    assert not any(x.rule == "engine_stall" for x in out2[-1])
    (p,) = [p for p in ses2.diag.pending if p.rule == "engine_stall"]
    assert p.target == URL and p.threshold_s == Thresholds().engine_stall_s
    assert 14.0 <= p.held_s(ses2.now) <= 16.0
    assert "running 8" in p.condition and p.names == "an engine stall"
    assert "dated by /metrics" in p.evidence[0]


def test_fewer_silent_streams_than_running_date_nothing() -> None:
    """Two silent streams while 8 run: the other six may be getting tokens unseen (non-streamed
    answers): the connections do not date the stall."""
    _, out = frozen(16, streams(2, 30.0))
    assert not any(x.rule == "engine_stall" for x in out[-1])


# --------------------------------------------------------------------------- a start without a log


def with_cpu(proc: Any, cpu: float) -> Any:
    kids = tuple(dataclasses.replace(c, cpu=cpu) for c in proc.children)
    return dataclasses.replace(proc, cpu=cpu, children=kids)


def start(seconds: int, cpu_per_s: float) -> tuple[F.Session, list[list[Alert]]]:
    """The port refuses, the server's tree exists, no log; its CPU grows ``cpu_per_s`` a second."""
    base0 = F.cpu_process()
    ses = F.Session(url=base0.url, process=base0)
    base = dataclasses.replace(base0, create_time=ses.clock.time() - 30.0)  # started 30 s before vtop looked
    out = []
    for i in range(seconds):
        ses.server(poll_from_error(base.url, "refused", t=F.R.BASE + i + ses.wall_offset, mono=F.R.BASE + i),
                   process=with_cpu(base, 5.0 + cpu_per_s * i))
        out.append(ses.tick(log_target=None))
    return ses, out


def test_a_still_start_without_a_log_is_named_from_its_processes() -> None:
    ses, out = start(60, 0.0)
    th = Thresholds()
    early = [x for x in out[int(th.startup_still_s) - 5] if x.rule == "startup_stall"]
    assert not early  # still for 40 s: not yet ...
    (a,) = [x for x in out[-1] if x.rule == "startup_stall"]
    assert a.severity == "warning" and a.target == ses.url
    assert "no log: the processes have been still for 59s" in a.title, a.title
    assert any("refuses connections" in e for e in a.evidence)
    # ... and while it was still for less than the threshold, it was pending
    ses2, _ = start(30, 0.0)
    (p,) = [p for p in ses2.diag.pending if p.rule == "startup_stall"]
    assert p.names == "a stalled start" and p.threshold_s == th.startup_still_s


def test_a_busy_start_without_a_log_stays_quiet_until_the_ceiling() -> None:
    ses, out = start(120, 0.8)
    assert not any(x.rule == "startup_stall" for tick in out for x in tick)
    assert not [p for p in ses.diag.pending if p.rule == "startup_stall"]
    # past the ceiling (--stall-threshold) it is said, as info: it may just be slow
    th = Thresholds(startup_ceiling_s=100.0)
    base = F.cpu_process()
    s2 = F.Session(th, url=base.url, process=base)
    base = dataclasses.replace(base, create_time=s2.clock.time() - 30.0)  # the clock starts 5 s before BASE
    got = []
    for i in range(80):
        s2.server(poll_from_error(base.url, "refused", t=F.R.BASE + i + s2.wall_offset, mono=F.R.BASE + i),
                  process=with_cpu(base, 5.0 + 0.8 * i))
        got.append([x for x in s2.tick(log_target=None) if x.rule == "startup_stall"])
    assert not any(got[:65])
    (a,) = got[-1]
    assert a.severity == "info" and "has been starting for 1m 54s (no log)" in a.title, a.title


# --------------------------------------------------------------------------- doctor: pending at the end of the window


def test_doctor_on_a_window_holding_a_pending_stall_exits_1_and_names_the_window_that_decides() -> None:
    """running 8 and nothing moving for the whole 5 s window, no log, no connections: not yet a
    stall (20 s), and not "no alerts" either: exit 1, the rule, and the window that would decide."""
    body = (Path(F.VLLM) / LOAD).read_text()
    with MetricsServer([body], model="/tmp/tinyllama", max_model_len=2048, version="0.32.0") as srv:
        r = subprocess.run([sys.executable, "-m", "vtop", "doctor", "--window", "5", "--no-gpu", "--json", srv.url],
                           capture_output=True, text=True, timeout=90, cwd=ROOT)
        t = subprocess.run([sys.executable, "-m", "vtop", "doctor", "--window", "5", "--no-gpu", srv.url],
                           capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert r.returncode == 1, (r.stdout, r.stderr)
    rep = json.loads(r.stdout)
    assert rep["exit_code"] == 1 and rep["alerts"] == []
    (p,) = rep["pending"]
    assert p["rule"] == "engine_stall" and p["threshold_s"] == 20.0
    assert 20 < p["decides_with_window_s"] <= 25, p
    assert t.returncode == 1, (t.stdout, t.stderr)
    assert "no alerts" not in t.stdout
    assert "[PENDING] engine_stall on :" in t.stdout and "for the whole 5 s window" in t.stdout
    # the text run is a second doctor, its window a second of its own: its number within the same bounds
    m = re.search(r"--window (\d+) would decide", t.stdout)
    assert m is not None and 20 < int(m.group(1)) <= 25, t.stdout
    # the exit line names that cause (it said "exit 1: unknown")
    port0 = srv.url.rsplit(":", 1)[-1]
    assert rep["exit_reason"] == (f"exit 1: [PENDING] engine_stall on :{port0} not yet decided "
                                  f"(--window {p['decides_with_window_s']} would decide)"), rep["exit_reason"]
    # and the evidence it lacked, once, with what would give it
    port = srv.url.rsplit(":", 1)[-1]
    missing = [n for n in rep["notes"] if n.startswith("evidence missing")]
    assert any(n.startswith("evidence missing: the vLLM log") for n in missing), rep["notes"]
    assert any(f"for :{port}: its processes" in n and "docker run --pid=container:NAME" in n for n in missing)
    assert len(missing) == len(set(missing))
    assert t.stdout.count(f"note: evidence missing for :{port}: its processes") == 1


# --------------------------------------------------------------------------- a stopped process (state T)


def with_state(proc: Any, cpu: float, state: str, *, only: tuple[int, ...] | None = None) -> Any:
    """The tree with CPU ``cpu`` each; ``state`` for the processes ``only`` names (all: None), S for the rest."""
    def st(pid: int) -> str:
        return state if only is None or pid in only else "S"
    kids = tuple(dataclasses.replace(c, cpu=cpu, state=st(c.pid)) for c in proc.children)
    return dataclasses.replace(proc, cpu=cpu, state=st(proc.pid), children=kids)


def test_a_start_whose_tree_is_stopped_is_named_once_watched_stopped_for_the_span() -> None:
    """Every process in state T (a SIGSTOP): still for good, so 5 s of it watched name the stalled start
    (the CPU-only path waits 45 s). The same still tree in state S is only pending then."""
    th = Thresholds()
    for state, named_by in (("T", th.stopped_min_span_s), ("S", th.startup_still_s)):
        base0 = F.cpu_process()
        ses = F.Session(url=base0.url, process=base0)
        base = dataclasses.replace(base0, create_time=ses.clock.time() - 30.0)
        first = None
        for i in range(60):
            ses.server(poll_from_error(base.url, "refused", t=F.R.BASE + i + ses.wall_offset, mono=F.R.BASE + i),
                       process=with_state(base, 5.0, state))
            got = [x for x in ses.tick(log_target=None) if x.rule == "startup_stall"]
            if got and first is None:
                first = (i, got[0])
        assert first is not None, state
        i, a = first
        assert named_by <= i <= named_by + 1, (state, i)
        if state == "T":
            assert "stopped (state T)" in a.title, a.title
            assert any("state T in the process table" in e for e in a.evidence)


def test_an_engine_that_does_not_run_while_nothing_moves_is_a_stall_within_a_short_window() -> None:
    """running 8, counters flat, no log, no connections. The EngineCore stopped (state T, watched 5 s), or
    sleeping with no CPU time (blocked, watched 10 s): named then, not at 20 s. An engine whose CPU moves
    (a collective spinning for a peer) is only pending then: the 20 s threshold decides it."""
    m = F.fixture_metrics(LOAD)
    proc = F.cpu_process()
    eng = proc.engine_pids()
    assert eng
    for state, cpu_per_s in (("T", 0.0), ("S", 0.0), ("R", 1.0)):
        ses = F.Session(process=proc, url=URL)
        first = None
        for i in range(16):
            ses.server(F.poll(URL, m, mono=F.R.BASE + i, wall_offset=ses.wall_offset, max_model_len=2048,
                              version="0.32.0"), process=with_state(proc, 5.0 + cpu_per_s * i, state, only=eng))
            got = [x for x in ses.tick(log_target=None) if x.rule == "engine_stall"]
            if got and first is None:
                first = (i, got[0])
        if state == "R":
            assert first is None
            assert [p for p in ses.diag.pending if p.rule == "engine_stall"]
            continue
        assert first is not None, state
        i, a = first
        want = Thresholds().stopped_min_span_s if state == "T" else Thresholds().startup_still_min_span_s
        assert want <= i <= want + 1, (state, i)
        ev = "\n".join(a.evidence)
        assert "the engine does not run" in ev, ev
        assert ("stopped (state T" in ev) == (state == "T"), ev


def test_with_no_vllm_at_all_no_log_is_not_missing_evidence() -> None:
    """Nothing answers and no vLLM process: the doctor's notes do not ask for a vLLM log (noise on a
    box without vLLM); the same doctor against a live server does (the test above)."""
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "vtop", "doctor", "--window", "1", "--no-gpu", "--json",
                        f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=90, cwd=ROOT)
    rep = json.loads(r.stdout)
    assert [s["state"] for s in rep["servers"]] == ["down"]
    assert not [n for n in rep["notes"] if n.startswith("evidence missing")], rep["notes"]


IDLE = "cpu-0.32.0-metrics-idle.txt"  # the same real CPU server with nothing running


def idle_stopped(stopped_at: list[int], seconds: int, *, scan_every: int = 10,
                 state: str = "T") -> tuple[F.Session, list[list[Alert]]]:
    """The real idle payload (running 0, counters flat) scraped every second, no log; a process scan every
    ``scan_every`` s (a new scan object: the one before, kept, is the same scan), the EngineCore in ``state``
    at the scans of the seconds in ``stopped_at`` (S at the others), as :8001's in the real run of two servers
    on one H100 (tests/fixtures/h100-two-servers): vLLM's gauges froze at 0 when its EngineCore stopped."""
    m = F.fixture_metrics(IDLE)
    proc = F.cpu_process()
    eng = proc.engine_pids()
    assert eng
    ses = F.Session(process=proc, url=URL)
    scan = with_state(proc, 5.0, "S", only=eng)
    out = []
    for i in range(seconds):
        if i % scan_every == 0:
            scan = with_state(proc, 5.0 + (0.0 if i in stopped_at else 0.5 * i), state if i in stopped_at else "S",
                              only=eng)
        ses.server(F.poll(URL, m, mono=F.R.BASE + i, wall_offset=ses.wall_offset, max_model_len=2048,
                          version="0.32.0"), process=scan)
        out.append(ses.tick(log_target=None))
    return ses, out


def test_an_engine_stopped_while_nothing_runs_is_named_at_its_second_stopped_scan() -> None:
    """Nothing running by /metrics (its gauges froze with the engine), the EngineCore in state T: one scan
    of it is pending (a py-spy dump stops a process for milliseconds), the next scan that still sees it
    stopped names the stall, however long the wait between them; a scan that sees it run again clears it."""
    stopped = [20, 30, 40]  # scans at 0, 10, 20, ...: T at 20, 30, 40; S again at 50
    ses, out = idle_stopped(stopped, 60)
    named = [i for i, alerts in enumerate(out) if any(a.rule == "engine_stall" for a in alerts)]
    assert named == list(range(30, 50)), named
    a = next(a for a in out[30] if a.rule == "engine_stall")
    assert a.severity == "critical" and a.target == URL
    assert "stopped (state T) for 10s" in a.title and "/metrics frozen at 0 running" in a.title, a.title
    assert a.since == F.R.BASE + 20  # the first scan that saw it stopped
    ev = "\n".join(a.evidence)
    assert "state T in the process table" in ev and "froze when it stopped" in ev, ev
    # between the first stopped scan and the second: pending, not named, however long the wait
    ses2, out2 = idle_stopped([20], 30, scan_every=20)  # one scan of T at 20, the next at 40 (after the end)
    assert not any(a.rule == "engine_stall" for alerts in out2 for a in alerts)
    (p,) = [p for p in ses2.diag.pending if p.rule == "engine_stall"]
    assert p.target == URL and p.threshold_s == Thresholds().stopped_min_span_s and p.since == F.R.BASE + 20


def test_an_idle_engine_that_is_not_stopped_is_no_stall() -> None:
    """The same idle server whose EngineCore sleeps (S) or runs (R) at every scan: nothing named, nothing
    pending (an idle engine uses no CPU: stillness alone is no stall)."""
    for state in ("S", "R"):
        ses, out = idle_stopped(list(range(0, 60, 10)), 60, state=state)
        assert not any(a.rule == "engine_stall" for alerts in out for a in alerts), state
        assert not [p for p in ses.diag.pending if p.rule == "engine_stall"], state


def test_the_live_feed_scans_again_at_once_while_a_finding_is_pending_or_a_stall_is_up() -> None:
    """Scans settled at 30 s apart (every server up): a finding pending, or a stall alert up, sets them back
    to every 5 s and scans now (the real run's stopped EngineCore waited 30 s for its second scan); nothing
    pending leaves them settled."""
    from vtop.config import Config
    from vtop.core.rules import Pending
    from vtop.monitor import Monitor
    from vtop.monitor.live import LiveFeed
    from vtop.monitor.polling import PollLoop

    for what in ("nothing", "pending", "alert"):
        m = Monitor(Config(urls=(URL,), no_gpu=True), find_logs=False)
        feed = LiveFeed(m, gpu_source=None, discover=None)
        pokes: list[int] = []
        loop = PollLoop("discovery", LiveFeed.SETTLED_SCAN_S, list, feed.on_discovery)
        loop.poke = functools.partial(pokes.append, 1)  # type: ignore[method-assign]
        feed.disc_loop = loop
        if what == "pending":
            m.diagnoser.pending = [Pending("engine_stall", URL, 1.0, 5.0, "stopped", "an engine stall")]
        elif what == "alert":
            m.diagnoser.alerts = [Alert("engine_stall", "critical", "Engine stalled", target=URL)]
        feed.collect()
        feed.collect()
        if what == "nothing":
            assert loop.interval == LiveFeed.SETTLED_SCAN_S and not pokes
        else:
            assert loop.interval == feed._scan_every() < LiveFeed.SETTLED_SCAN_S and pokes == [1], what


def test_a_stall_is_pending_only_once_a_scrape_saw_nothing_move() -> None:
    """The newest scrape showing tokens made says nothing of the second after it: no scrape yet is not a stopped
    engine. A one-shot whose window ended a second after a burst's second scrape said "[PENDING] engine_stall"
    (tests/unit/test_headless.py, three CI runs on a loaded box). A scrape with nothing moved makes it pending."""
    base = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
    ses = F.Session(Thresholds())
    t0 = F.R.BASE
    gen = base.generation_tokens_total or 0.0
    ses.metrics(F.grow(base, generation_tokens_total=gen), mono=t0, max_model_len=32768)
    ses.metrics(F.grow(base, generation_tokens_total=gen + 9000.0), mono=t0 + 1.0, max_model_len=32768)
    ses.to(t0 + 2.6)  # no scrape since the one that saw tokens made
    ses.tick()
    assert not [p for p in ses.diag.pending if p.rule == "engine_stall"]
    ses.metrics(F.grow(base, generation_tokens_total=gen + 9000.0), mono=t0 + 2.7, max_model_len=32768)
    ses.tick()
    (p,) = [p for p in ses.diag.pending if p.rule == "engine_stall"]
    assert p.threshold_s == Thresholds().engine_stall_s


# --------------------------------------------------------------------------- a start that failed, without a log


def _failures(alerts: list[Alert]) -> list[Alert]:
    return [a for a in alerts if a.rule == "startup_failure"]


def test_a_start_whose_processes_went_before_the_port_answered_failed_and_stays_failed_until_it_answers() -> None:
    """No log: a server process seen while the port refused, then the process table without it, the port never
    having answered. A crash loop's next start keeps the alert (it ends when the server answers)."""
    from vtop.sources.vllm import poll_from_body

    base0 = F.cpu_process()
    ses = F.Session(url=base0.url, process=base0)
    first = dataclasses.replace(base0, create_time=ses.clock.time() - 5.0)
    i = 0

    def refused(process: Any) -> list[Alert]:
        nonlocal i
        ses.server(poll_from_error(base0.url, "refused", t=F.R.BASE + i + ses.wall_offset, mono=F.R.BASE + i),
                   process=process)
        i += 1
        return ses.tick(log_target=None)

    for _ in range(20):  # starting: a process, the port refusing
        assert not _failures(refused(with_cpu(first, 3.0 + i)))
    (a,) = _failures(refused(None))  # the process table holds none of it
    assert a.severity == "critical" and a.target == base0.url
    m = re.search(r"exited while starting after running (\d+)s, before its port ever answered \(no log", a.title)
    assert m and 24 <= int(m.group(1)) <= 30, a.title  # created 5 s before the first of 20 ticks a second apart
    assert any(f"process {base0.pid} was seen starting" in e for e in a.evidence), a.evidence
    assert any("cannot say why" in e for e in a.evidence)
    assert any("docker logs" in f for f in a.fix) and any("--log" in f for f in a.fix)
    for _ in range(5):  # down: still failed, the same alert
        (b,) = _failures(refused(None))
        assert b.since == a.since
    second = dataclasses.replace(base0, pid=base0.pid + 100, create_time=ses.clock.time())
    (c,) = _failures(refused(with_cpu(second, 1.0)))  # a crash loop's next start: not over yet
    assert c.since == a.since and any("a new start is running" in e for e in c.evidence)
    text = (Path(F.VLLM) / LOAD).read_text()
    ses.server(poll_from_body(base0.url, text, t=F.R.BASE + i + ses.wall_offset, mono=F.R.BASE + i),
               process=with_cpu(second, 30.0))
    assert not _failures(ses.tick(log_target=None))  # it answers: the start did not fail


def test_a_server_that_answered_and_then_closed_its_port_is_no_failed_start() -> None:
    """The process that answered, seen again while its port refuses (shutting down, or restarting inside
    the same process), then gone: a stop, not a start that failed."""
    from vtop.sources.vllm import poll_from_body

    base0 = F.cpu_process()
    ses = F.Session(url=base0.url, process=base0)
    proc = dataclasses.replace(base0, create_time=ses.clock.time() - 100.0)
    text = (Path(F.VLLM) / LOAD).read_text()
    out = []
    for i in range(30):
        mono = F.R.BASE + i
        if i < 10:
            ses.server(poll_from_body(base0.url, text, t=mono + ses.wall_offset, mono=mono), process=proc)
        else:
            ses.server(poll_from_error(base0.url, "refused", t=mono + ses.wall_offset, mono=mono),
                       process=proc if i < 20 else None)
        out.append(ses.tick(log_target=None))
    assert not [a for tick in out for a in _failures(tick)]


# --------------------------------------------------------------------------- an engine found dead, without a log


def _dead_engine(seconds_dead: int, *, log: bool = False) -> tuple[F.Session, list[list[Alert]]]:
    """A vLLM server answering /metrics, then /health 503 (EngineDeadError) for ``seconds_dead`` s, then refusing."""
    from vtop.sources.vllm import poll_from_body

    base0 = F.cpu_process()
    ses = F.Session(url=base0.url, process=base0)
    text = (Path(F.VLLM) / LOAD).read_text()
    out = []
    for i in range(10 + seconds_dead + 5):
        mono = F.R.BASE + i
        if i < 10 + seconds_dead:
            health = 200 if i < 10 else 503
            ses.server(poll_from_body(base0.url, text, t=mono + ses.wall_offset, mono=mono, health=health,
                                      health_polled=True))
        else:
            ses.server(poll_from_error(base0.url, "refused", t=mono + ses.wall_offset, mono=mono), process=None)
        out.append(ses.tick(log_target=base0.url if log else None))
    return ses, out


def test_an_engine_found_dead_by_health_without_a_log_is_named_and_stays_named_after_the_exit() -> None:
    ses, out = _dead_engine(4)
    assert not [a for a in out[9] if a.rule == "engine_died"]
    (a,) = [a for a in out[10] if a.rule == "engine_died"]  # the first 503
    assert a.severity == "critical" and "died: /health answered 503 (no log" in a.title, a.title
    assert any("EngineDeadError" in e for e in a.evidence)
    (b,) = [a for a in out[-1] if a.rule == "engine_died"]  # the API server exited: still dead, the same alert
    assert b.since == a.since and any("the API server exited after it" in e for e in b.evidence)
