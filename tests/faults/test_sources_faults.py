"""Fault matrix, the sources (issue #25 items 1, 2, 10 and the matrix's server and NVML rows): a server
that misbehaves in each way :mod:`tests.helpers.badserver` knows, and NVML absent, lost, NotSupported
or hanging, each through the real command line (``vtop --once`` / ``vtop doctor``, in-process).

Each case asserts: no traceback, the clear line vtop says, the exit status the README documents
(``vtop/exitcodes.py``). Nothing here times anything: a hung call is released by a guard thread
only if vtop would otherwise wait for it, and the test then fails on the guard having fired.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import vtop.sources.nvml as nvml_mod
from tests.helpers.badserver import BadServer
from vtop.cli import main
from vtop.sources.fake_nvml import FakeGpu, FakeNvml, NVMLError_LibraryNotFound, NVMLError_NotSupported

GUARD_S = 90.0  # hang guard only: a healthy run, however loaded the box, never gets near it


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    for k in ("VTOP_INTERVAL", "VTOP_NO_GPU", "VTOP_SIMULATE_GPUS", "VTOP_URLS", "VTOP_LOG"):
        monkeypatch.delenv(k, raising=False)


def once(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.out + cap.err, cap.out + cap.err
    return rc, cap.out


# --- servers -------------------------------------------------------------------------------------

#: mode -> (exit status, what the report says); the exit status is the README's (vtop/exitcodes.py):
#: 2 down, 1 an API server that accepts and does not answer (api_unresponsive warning), 3 a server
#: whose /metrics is not vLLM's (vtop could not look), 0 a server read fine
SERVER_CASES: dict[str, tuple[int, str]] = {
    "ok": (0, "UP tiny"),
    "refused": (2, "connection refused"),
    "hang": (1, "not answering: no complete /metrics answer for"),
    "slow": (1, "not answering: no complete /metrics answer for"),
    "trickle": (1, "not answering: no complete /metrics answer for"),
    "html": (3, "answered an HTML page"),
    "404": (3, "answered HTTP 404"),
    "500": (3, "answered HTTP 500"),
    "huge": (3, "not reading more than 16 MiB"),
    "huge-close": (3, "sent more than 16 MiB"),
    "garbage": (3, "not Prometheus text"),
    "chunked": (0, "UP tiny"),
    "gzip": (0, "UP tiny"),
    "redirect": (3, "answered HTTP 302"),
    "reset": (0, "counters went back to zero"),
    "unknown": (3, "none from vLLM"),
}


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m in ("hang", "slow", "trickle") else m
                                  for m in SERVER_CASES])
def test_a_misbehaving_server_gets_a_line_and_its_exit_status(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    want_rc, want = SERVER_CASES[mode]
    with BadServer(mode) as srv:
        rc, out = once(["--once", "--window", "1", "--interval", "0.5", "--no-gpu", srv.url], capsys)
    assert want in out, out
    assert rc == want_rc, out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hang", "trickle"])
def test_a_server_that_accepts_and_never_answers_is_an_incident_in_doctor_and_json(
        mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue #25 item 2: was STALE "no data yet", no alert, exit 0, doctor "no alerts".
    with BadServer(mode) as srv:
        rc, out = once(["doctor", "--window", "1", "--interval", "0.5", "--no-gpu", srv.url], capsys)
        assert rc == 1 and "[WARNING] API server of" in out and "no alerts" not in out, out
        assert "py-spy dump" in out and "event loop" in out
        rc, out = once(["--once", "--json", "--window", "1", "--interval", "0.5", "--no-gpu", srv.url], capsys)
    rep = json.loads(out)
    (alert,) = [a for a in rep["alerts"] if a["rule"] == "api_unresponsive"]
    assert alert["target"] == srv.url and alert["severity"] == "warning"
    assert rc == rep["exit_code"] == 1


# --- NVML ----------------------------------------------------------------------------------------


@pytest.fixture
def healthy_server() -> Iterator[str]:
    with BadServer("ok") as srv:
        yield srv.url


def _fake(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml) -> None:
    monkeypatch.setattr(nvml_mod, "make_gpu_source", lambda cfg, **kw: nvml_mod.NvmlSource(nvml=nvml))


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ["--once", "doctor"])
def test_a_hung_nvml_call_does_not_hang_once_or_doctor(cmd: str, healthy_server: str, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # Issue #25 item 1: the poll thread held NVML's lock in a call that never returns and the
    # shutdown waited on that lock for good (doctor took 122 s, then exit 0).
    release = threading.Event()
    entered = threading.Event()

    def hang() -> Any:
        entered.set()
        release.wait()
        raise NVMLError_NotSupported(3)

    guard = threading.Timer(GUARD_S, release.set)
    guard.daemon = True
    guard.start()
    try:
        _fake(monkeypatch, FakeNvml([FakeGpu(overrides={"utilization": hang})]))
        rc, out = once([cmd, "--window", "1", "--interval", "0.5", healthy_server], capsys)
        guard_fired = release.is_set()
    finally:
        guard.cancel()
        release.set()
    assert entered.is_set()  # the call did hang
    assert not guard_fired, "vtop waited for the hung NVML call until the guard released it"
    assert "NVML (GPU readings): no answer within" in out, out
    assert "UP tiny" in out  # the healthy server is reported as such, not STALE
    assert rc == 3, out  # unknown: vtop could not look at the GPUs


def test_nvml_close_gives_up_while_a_call_holds_it() -> None:
    release, entered = threading.Event(), threading.Event()

    def hang() -> Any:
        entered.set()
        release.wait()
        return 1

    src = nvml_mod.NvmlSource(nvml=FakeNvml([FakeGpu(overrides={"temperature": hang})]))
    t = threading.Thread(target=src.poll, daemon=True)
    t.start()
    try:
        assert entered.wait(GUARD_S)
        assert src.close(wait_s=0.0) is False  # the shutdown does not wait behind the call
    finally:
        release.set()
        t.join(GUARD_S)
    assert src.close(wait_s=GUARD_S) is True


@pytest.mark.parametrize("case, want_rc, want", [
    ("absent", 0, "GPU: "),
    ("lost", 0, "LOST (fell off the bus or driver error)"),
    ("notsupported", 0, "GPU 0 NVIDIA H200: util"),
])
def test_nvml_faults_get_a_line(case: str, want_rc: int, want: str, healthy_server: str,
                                monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if case == "absent":
        nv = FakeNvml(init_error=NVMLError_LibraryNotFound(12))
    elif case == "lost":
        nv = FakeNvml([FakeGpu(), FakeGpu(lost=True)])
    else:
        ns = NVMLError_NotSupported(3)
        nv = FakeNvml([FakeGpu(overrides={"temperature": ns, "power": ns, "throttle": ns}, gpm=False)])
    _fake(monkeypatch, nv)
    rc, out = once(["--once", "--window", "1", "--interval", "0.5", healthy_server], capsys)
    assert want in out, out
    if case == "absent":
        gpu_line = next(ln for ln in out.splitlines() if ln.startswith("GPU: "))
        assert "NVML" in gpu_line or "no GPU" in gpu_line or "driver" in gpu_line, gpu_line
    if case == "notsupported":
        line = next(ln for ln in out.splitlines() if ln.startswith("GPU 0"))
        assert " - " in line or line.rstrip().endswith("-"), line  # a gap, never a zero
        assert " 0 W" not in line and " 0 C" not in line
    assert rc == want_rc, out


# --- the api_unresponsive rule on an injected clock --------------------------------------------


def test_api_unresponsive_is_a_warning_then_critical_and_clears_on_an_answer() -> None:
    from pathlib import Path

    from vtop.clock import FakeClock
    from vtop.core.rules import Diagnoser, Evidence, Thresholds
    from vtop.core.server import ServerTracker
    from vtop.sources.vllm import poll_from_body, poll_from_error

    url = "http://127.0.0.1:8000"
    body = (Path(__file__).parent.parent / "fixtures" / "vllm" / "cpu-0.32.0-metrics-idle.txt").read_bytes()
    clock = FakeClock(1000.0)
    tr = ServerTracker(url, clock=clock)
    dx = Diagnoser(Thresholds())
    tr.feed(poll_from_body(url, body, t=clock.time(), mono=clock.monotonic(), latency_s=0.01, status=200))
    seen: list[tuple[float, str | None]] = []
    clock.advance(0.5)
    first = clock.monotonic()  # the first scrape that gets no answer starts here
    for _ in range(12):  # a timed-out scrape every 3 s (the scraper's deadline): 36 s of silence
        start = clock.monotonic()
        clock.advance(3.0)
        tr.feed(poll_from_error(url, "timeout", t=clock.time(), mono=start,
                                message=f"/metrics: no complete answer from {url} within 3.0 s"))
        alerts = [a for a in dx.update(Evidence(clock.monotonic(), {url: tr.view()})) if a.rule == "api_unresponsive"]
        seen.append((clock.monotonic() - first, alerts[0].severity if alerts else None))
    th = Thresholds()
    for silent, sev in seen:
        want = None if silent < th.api_silent_s else "warning" if silent < th.api_silent_critical_s else "critical"
        assert sev == want, (silent, sev)
    assert {s for _, s in seen} == {None, "warning", "critical"}
    clock.advance(1.0)
    tr.feed(poll_from_body(url, body, t=clock.time(), mono=clock.monotonic(), latency_s=0.01, status=200))
    assert not [a for a in dx.update(Evidence(clock.monotonic(), {url: tr.view()})) if a.rule == "api_unresponsive"]
    # a refused port is not this rule's (down), nor an HTTP error (the server answered)
    for kind in ("refused", "http 500"):
        t2 = ServerTracker(url, clock=clock)
        for _ in range(12):
            clock.advance(3.0)
            t2.feed(poll_from_error(url, kind, t=clock.time(), mono=clock.monotonic()))
        assert not [a for a in Diagnoser().update(Evidence(clock.monotonic(), {url: t2.view()}))
                    if a.rule == "api_unresponsive"]


@pytest.mark.slow
async def test_the_screen_names_a_server_that_accepts_and_never_answers() -> None:
    # Issue #25 item 2 on the live screen: the alert (with what to do) above the STALE card,
    # while the keys still answer.
    import asyncio

    from vtop.config import Config
    from vtop.ui.app import VtopApp
    from vtop.ui.widgets.alerts_panel import AlertsPanel

    with BadServer("hang") as srv:
        app = VtopApp(Config(urls=(srv.url,), no_gpu=True, interval=0.5), hostname="t")
        async with app.run_test(size=(120, 40)) as pilot:
            loop = asyncio.get_running_loop()
            end = loop.time() + GUARD_S  # hang guard only
            while not any(a.rule == "api_unresponsive" for a in app.monitor.alerts):
                assert loop.time() < end, "hang guard: no api_unresponsive alert"
                await pilot.pause(0.1)
            await pilot.pause()
            text = app.query_one(AlertsPanel).render_alerts().plain
            assert "not answering" in text and srv.url.rsplit(":", 1)[1] in text, text
            await pilot.press("r")  # a key still answers while the scrapes hang
            await pilot.pause()
            assert len(app.screen_stack) > 1
