"""A log belongs to one server: with two vLLM servers on the box, only the process that
writes the ``--log`` file feeds its tracker's launch time (real processes, real /proc)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from vtop.clock import FakeClock
from vtop.config import Config
from vtop.monitor import Monitor
from vtop.monitor.monitor import make_log_watch
from vtop.sources.discovery import ProcRecord, discover_servers
from vtop.sources.logtail import log_written_by


def server(pid: int, port: int, create_time: float):  # type: ignore[no-untyped-def]
    cmd = ("/usr/bin/python3", "/usr/bin/vllm", "serve", "tiny", "--port", str(port))
    return discover_servers([ProcRecord(pid, 1, "vllm", cmd, create_time)])[0]


def test_only_the_process_writing_the_log_marks_its_launch(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("")
    other_log = tmp_path / "other.log"
    with log.open("ab") as mine_out, other_log.open("ab") as other_out:
        writer = subprocess.Popen(["sleep", "30"], stdout=mine_out, stderr=mine_out)
        other = subprocess.Popen(["sleep", "30"], stdout=other_out, stderr=other_out)
    try:
        assert log_written_by(writer.pid, str(log)) is True
        assert log_written_by(other.pid, str(log)) is False
        now = time.time()
        clock = FakeClock(start=100.0, wall_offset=now - 100.0)
        cfg = Config(log=str(log))  # no URL: both servers are discovered and watched
        m = Monitor(cfg, clock=clock, log_watch=make_log_watch(cfg, clock=clock))
        foreign = server(other.pid, 8001, now - 129_203.0)  # started a day and a half ago
        ours = server(writer.pid, 8000, now - 5.0)
        m.apply_procs([foreign, ours])
        assert set(m.servers) == {foreign.url, ours.url}
        assert m.log_server == ours.url and m.log_target == ours.url
        lw = m.log_watch
        assert lw is not None
        view = lw.poll()
        # the tracker took our launch, 5 s ago, not the other server's
        started = view.snapshot.started  # on the log's clock: local time, as vLLM stamps its lines
        assert started is not None and abs(started - (now - 5.0 + time.localtime(now).tm_gmtoff)) < 1.0
    finally:
        for p in (writer, other):
            p.kill()
            p.wait()


def test_a_log_no_watched_process_writes_gets_no_launch_from_them(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("")
    with (tmp_path / "a.log").open("ab") as a_out, (tmp_path / "b.log").open("ab") as b_out:
        a = subprocess.Popen(["sleep", "30"], stdout=a_out)
        b = subprocess.Popen(["sleep", "30"], stdout=b_out)
    try:
        clock = FakeClock()
        cfg = Config(log=str(log))
        m = Monitor(cfg, clock=clock, log_watch=make_log_watch(cfg, clock=clock))
        m.apply_procs([server(a.pid, 8000, 1.0), server(b.pid, 8001, 2.0)])
        assert m.log_server is None  # neither writes it: neither feeds the tracker
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
