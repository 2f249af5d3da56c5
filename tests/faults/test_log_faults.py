"""Fault matrix, broken logs (issue #25 item 8 and the matrix's log rows): a ``--log`` that is missing, a
directory, unreadable, binary, a pipe that closes, a 10 MB line, a 2 GB file (sparse); and the start
time that came out negative ("ready in -1796162519.7 s").

Each case: no traceback, one clear line where the startup panel is and in ``--once``/JSON notes, the
exit status of the other sources (a broken log is a note, not a verdict on the server). Rotation,
truncation, ``\\r`` and ANSI are tests/unit/test_logtail.py's (referenced in the README's table).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import vtop.sources.logtail as logtail
from tests.helpers.badserver import BadServer
from vtop.cli import main
from vtop.core.phases import PhaseTracker
from vtop.monitor.logwatch import LogWatch
from vtop.sources.logtail import LogTailer, StreamTailer


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    monkeypatch.delenv("VTOP_LOG", raising=False)


def _log(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    p = tmp_path / "vllm.log"
    if case == "missing":
        return p
    if case == "directory":
        p.mkdir()
    elif case == "binary":
        p.write_bytes(bytes(range(256)) * 400 + os.urandom(50_000))
    elif case == "unreadable":
        p.write_text("INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.32.0\n")
        p.chmod(0)
        real_open = os.open

        def denied(path: object, *a: object, **k: object) -> int:  # root reads a 0000 file: deny it here
            if str(path) == str(p):
                raise PermissionError(13, "Permission denied", str(p))
            return real_open(path, *a, **k)  # type: ignore[arg-type]

        monkeypatch.setattr(logtail.os, "open", denied)
    return p


CASES = {
    "missing": "does not exist (yet)",
    "directory": "is a directory, not a log file",
    "unreadable": "permission denied",
    "binary": "does not look like a text log",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_log_is_said_in_once_and_json(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # Issue #25 item 8: nothing was said (a missing, a directory, an unreadable or a binary --log).
    log = _log(tmp_path, case, monkeypatch)
    with BadServer("ok") as srv:
        argv = ["--once", "--window", "1", "--interval", "0.5", "--no-gpu", "--log", str(log), srv.url]
        rc = main(argv)
        text = capsys.readouterr()
        rc_json = main([*argv, "--json"])
        js = capsys.readouterr()
    assert "Traceback" not in text.out + text.err + js.out + js.err
    notes = [ln for ln in text.out.splitlines() if ln.startswith("note: vLLM log:")]
    assert any(CASES[case] in n and str(log) in n for n in notes), text.out
    rep = json.loads(js.out)
    assert any(CASES[case] in n for n in rep["notes"]), rep["notes"]
    assert CASES[case] in rep["startup"]["log_problem"]
    assert rc == rc_json == 0  # the server is fine: the log's problem is a note, not a verdict


def test_a_pipe_that_closes_says_input_ended() -> None:
    r, w = os.pipe()
    os.write(w, b"INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.32.0\n")
    os.close(w)
    watch = LogWatch(StreamTailer(r, name="-"))
    try:
        for _ in range(50):  # polls until it has read to the end: counted, not timed
            view = watch.poll()
            if view.tail.status == "ended":
                break
        assert view.tail.status == "ended"
        assert view.problem is not None and "input ended" in view.problem
        assert view.lines_total == 1  # nothing lost
    finally:
        watch.close()


def test_a_ready_before_any_stamped_line_is_never_a_negative_start_time() -> None:
    # Issue #25 item 8: the launch's epoch time minus a monotonic clock: "ready in -1796162519.7 s".
    t = PhaseTracker()
    t.mark_process_start(time.time() - 30.0, arrival=1000.0)
    t.mark_ready(1005.0)
    snap = t.snapshot()
    assert snap.state == "ready"
    assert snap.total_s is not None and 0.0 <= snap.total_s <= 60.0, snap.total_s
    # the same through a watched log that is missing (no line ever read)
    watch = LogWatch(LogTailer("/nonexistent/vllm.log"))
    watch.mark_process_start(time.time() - 30.0, 2000.0)
    watch.mark_ready(2004.0)
    total = watch.poll().snapshot.total_s
    assert total is not None and 0.0 <= total <= 60.0, total


def test_a_10_mb_line_is_cut_and_the_next_line_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "vllm.log"
    p.write_bytes(b"INFO 12-01 10:00:00 [x.py:1] " + b"A" * (10 * 2**20) + b"\nINFO 12-01 10:00:01 [x.py:2] next\n")
    tailer = LogTailer(str(p), jump_to_last_startup=False)
    lines: list[str] = []
    for _ in range(100):  # each poll reads a bounded amount: counted polls
        got = tailer.poll()
        lines += got
        if any("next" in ln for ln in lines):
            break
    assert any(ln.endswith("next") for ln in lines)
    assert max(len(ln) for ln in lines) <= logtail.DEFAULT_MAX_LINE + 8  # cut, not held whole
    assert tailer.state.status == "following"


def test_a_2_gb_log_is_attached_without_reading_it_all(tmp_path: Path) -> None:
    p = tmp_path / "vllm.log"
    with open(p, "wb") as f:  # sparse: 2 GiB of holes (NUL bytes) then a real tail
        f.seek(2 * 2**30)
        f.write(b"\nINFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.32.0\n"
                b"INFO 12-01 10:00:05 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s\n")
    watch = LogWatch(LogTailer(str(p)))
    try:
        view = watch.poll()
        assert view.tail.status == "following"
        assert view.tail.offset >= 2 * 2**30 - 64 * 2**20  # jumped near the end, not read from 0
        assert view.problem is None or "binary" not in view.problem
    finally:
        watch.close()


async def test_the_startup_panel_says_what_is_wrong_with_the_log_and_keys_still_answer(tmp_path: Path) -> None:
    from vtop.clock import FakeClock
    from vtop.config import Config
    from vtop.ui.app import VtopApp
    from vtop.ui.widgets.log_pane import LogPane
    from vtop.ui.widgets.startup_panel import StartupPanel

    missing = tmp_path / "nope.log"
    r, w = os.pipe()
    os.write(w, b"INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.32.0\n")
    os.close(w)
    for source, want in ((LogTailer(missing), f"{missing} does not exist (yet)"),
                         (StreamTailer(r, name="-"), "input ended (standard input was closed by its writer)")):
        watch = LogWatch(source, clock=FakeClock())
        app = VtopApp(Config(no_gpu=True), autopoll=False, hostname="t", log_watch=watch)
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(20):  # polls, counted: the pipe's end is seen within a few
                await app.poll_log_once()
                await pilot.pause()
                if want in app.query_one(StartupPanel).build().plain:
                    break
            assert want in app.query_one(StartupPanel).build().plain
            pane = app.query_one(LogPane)
            shown = pane.display
            await pilot.press("l")  # the UI answers a key
            await pilot.pause()
            assert pane.display != shown
