"""`vtop --once` without `--window` (issue #26 item 5): one round of readings, at once.

It answers from what needs no window (the gauges, the GPUs, the phase, the alerts the
log's history feeds) after each source's first answer: one scrape, no sampling window;
rates are null (not 0) unless the server's log has a recent stats line; the headless path
imports no Textual. Nothing here times anything: "no window" is shown by the scrapes a
server got with a poll interval of 30 s (a window waits two intervals, and scrapes again).
The wall time is bench/oneshot.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.helpers.badserver import BadServer
from tests.helpers.metrics_server import MetricsServer, h200_payloads
from vtop.cli import main
from vtop.faces.headless import ONE_ROUND_NOTE

SCHEMA = json.loads((Path(__file__).parents[2] / "vtop" / "schema" / "report-v2.schema.json").read_text())
ENV = {**os.environ, "XDG_CONFIG_HOME": "/nonexistent", "HOME": "/nonexistent"}


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


def test_once_answers_from_one_scrape_with_rates_null(capsys: pytest.CaptureFixture[str]) -> None:
    # seconds 19-24 of the H200 run: the burst begins
    from vtop.sources.metrics_text import parse_vllm_metrics

    payloads = h200_payloads(19, 6)
    first = parse_vllm_metrics(payloads[0])
    assert first.running and first.waiting  # the burst's first second: queues up
    with MetricsServer(payloads) as srv:
        rc, out = once(["--once", "--json", "--interval", "30", "--simulate-gpus", "2", srv.url], capsys)
        scrapes = srv.scrapes
    rep = json.loads(out)
    jsonschema.validate(rep, SCHEMA)
    assert scrapes == 1, "one round is one scrape: a window (2 intervals, 60 s here) scrapes again"
    assert rep["one_round"] is True and rep["window_asked_s"] is None
    s = rep["servers"][0]
    assert s["polls"] == 1 and s["state"] == "up"
    assert (s["running"], s["waiting"]) == (first.running, first.waiting) and s["kv_cache_pct"] is not None
    # rates need two scrapes: null, never 0, and said so
    assert s["gen_tokens_per_s"] is None and s["prompt_tokens_per_s"] is None and s["preemptions_per_s"] is None
    assert s["rates_from"] is None and ONE_ROUND_NOTE in rep["notes"]
    assert [g["index"] for g in rep["gpu"]["gpus"]] == [0, 1] and rep["gpu"]["gpus"][0]["util_pct"] is not None
    assert rc == rep["exit_code"] == 0


def test_window_still_measures_rates(capsys: pytest.CaptureFixture[str]) -> None:
    with MetricsServer(h200_payloads(19, 6)) as srv:
        rc, out = once(["--once", "--json", "--window", "1", "--interval", "0.5", "--no-gpu", srv.url], capsys)
    rep = json.loads(out)
    s = rep["servers"][0]
    assert rep["one_round"] is False and rep["window_asked_s"] == 1.0
    assert s["gen_tokens_per_s"] is not None and s["gen_tokens_per_s"] > 0 and s["rates_from"] == "metrics"
    assert ONE_ROUND_NOTE not in rep["notes"]


def _stats_log(path: Path, age_s: float) -> Path:
    """A vLLM 0.26 log whose last stats line was stamped ``age_s`` ago (local time, as vLLM stamps)."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(time.time() - age_s))
    path.write_text(
        f"(APIServer pid=1551) INFO {stamp} [loggers.py:123] Engine 000: Avg prompt throughput: 5.7 tokens/s, "
        "Avg generation throughput: 127.4 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 0.2%, Prefix cache hit rate: 0.0%\n")
    return path


@pytest.mark.parametrize(("age_s", "want"), [(2.0, 127.4), (300.0, None)])
def test_once_takes_rates_from_a_recent_stats_line_of_the_log(
        age_s: float, want: float | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _stats_log(tmp_path / "vllm.log", age_s)
    with MetricsServer(h200_payloads(19, 6)) as srv:
        rc, out = once(["--once", "--json", "--interval", "30", "--no-gpu", "--log", str(log), srv.url], capsys)
        rc, txt = once(["--once", "--interval", "30", "--no-gpu", "--log", str(log), srv.url], capsys)
    rep = json.loads(out)
    jsonschema.validate(rep, SCHEMA)
    s = rep["servers"][0]
    assert s["gen_tokens_per_s"] == want
    if want is None:  # five minutes old: says nothing of now
        assert s["rates_from"] is None and s["prompt_tokens_per_s"] is None and ONE_ROUND_NOTE in rep["notes"]
    else:
        assert s["rates_from"] == "log" and s["prompt_tokens_per_s"] == 5.7 and s["rates_age_s"] <= 12
        assert ONE_ROUND_NOTE not in rep["notes"]
    assert "(one round of readings, " in txt.splitlines()[0]
    assert ("gen 127 tok/s prompt 5.7 tok/s (vLLM log, " in txt) == (want is not None), txt


def test_the_headless_path_imports_no_textual() -> None:
    # A new interpreter: what `vtop --once` loads. Textual (and Rich under it) are the screen's.
    code = ("import sys; from vtop.cli import main; rc = main(['--once', '--json', '--no-gpu', "
            "'--interval', '30', 'http://127.0.0.1:9']); "
            "print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & {'textual', 'rich'}), rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV)
    last = r.stdout.strip().splitlines()[-1]
    assert last == "LOADED [] 2", r.stdout[-2000:] + r.stderr[-2000:]  # down: critical, as documented


@pytest.mark.slow
def test_a_server_that_accepts_and_never_answers_is_still_judged_in_one_round(
        capsys: pytest.CaptureFixture[str]) -> None:
    # The deadline of every source stays: one round waits for the api_unresponsive rule to judge it.
    with BadServer("hang") as srv:
        rc, out = once(["--once", "--json", "--interval", "0.5", "--no-gpu", srv.url], capsys)
    rep = json.loads(out)
    (alert,) = [a for a in rep["alerts"] if a["rule"] == "api_unresponsive"]
    assert alert["target"] == srv.url and rep["one_round"] is True
    assert rc == rep["exit_code"] == 1


def test_one_round_polls_the_gpus_once_while_it_waits_for_a_slow_server() -> None:
    """The round waits for every source's first answer. Before, the GPU loop polled again at its interval
    meanwhile, and the exit waited for that second poll to leave NVML (0.5 s of a 0.7 s one-shot on a lent
    H100 80GB, 2026-12-05: ``NvmlSource.close`` on its lock). One round is one GPU poll, and the source is
    closed with no poll in flight. Counted, not timed: the slow server is answered after 10 s, so at a
    0.25 s interval the GPU loop had many intervals to poll again."""
    import io

    from vtop.config import Config
    from vtop.faces.headless import run_once
    from vtop.sources.nvml import make_gpu_source

    src = make_gpu_source(Config(interval=0.25, simulate_gpus=1), one_round=True)
    polls: list[int] = []
    closed: list[bool] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(src, name)

        def poll(self) -> Any:
            polls.append(1)
            return src.poll()

        def close(self, *a: Any, **k: Any) -> bool:
            closed.append(src.close(wait_s=0.0))
            return closed[-1]

    with BadServer("slow") as srv:
        cfg = Config(interval=0.25, simulate_gpus=1, urls=(srv.url,))
        out = io.StringIO()
        run_once(cfg, window_s=None, as_json=True, out=out, gpu_source=Counting())
    rep = json.loads(out.getvalue())
    assert rep["one_round"] is True and [g["index"] for g in rep["gpu"]["gpus"]] == [0]
    assert len(polls) == 1, f"{len(polls)} GPU polls in one round"
    assert closed == [True]  # the lock was free at once: no poll in flight at the exit


def test_one_round_closes_the_gpu_source_with_no_poll_in_flight() -> None:
    """The same, told by events rather than a slow server: the process scan (the source the round waits
    for last) answers only once the GPU loop has either started a second poll or ended. A second poll is
    held in the driver (it waits on an event) and the source's ``close`` records whether one is in flight:
    the one-shot must close NVML with none (a close beside a poll in flight is what the exit waited for;
    ``NvmlSource.close`` gives up after 1 s and skips ``nvmlShutdown``). No time is asserted."""
    import asyncio
    import threading

    from vtop.config import Config
    from vtop.faces.headless import one_round
    from vtop.model.gpu import GpuPoll
    from vtop.monitor import Monitor
    from vtop.monitor.live import LiveFeed

    second_poll = threading.Event()
    release = threading.Event()

    class HeldGpu:
        """A GPU source whose second poll is held until released."""

        def __init__(self) -> None:
            self.polls = self.returned = 0
            self.closed_in_flight: list[bool] = []

        def poll(self) -> GpuPoll:
            self.polls += 1
            if self.polls > 1:
                second_poll.set()
                release.wait(30)
            self.returned += 1
            return GpuPoll(t=time.time(), mono=time.monotonic(), status="absent", message="held GPU")

        def close(self) -> None:
            self.closed_in_flight.append(self.polls > self.returned)

    def gpu_loop_alive() -> bool:
        return any(t.name == "vtop-poll-gpu" and t.is_alive() for t in threading.enumerate())

    def discover() -> list[Any]:
        # wait until the GPU loop has answered once (its result applied at the round's tick), then until it
        # has either polled again (the bug) or ended (one round, one poll); 30 s only if neither ever came
        end = time.monotonic() + 30
        while time.monotonic() < end and not (feed.gpu_loop is not None and feed.gpu_loop.polls >= 1):
            second_poll.wait(0.01)
        while time.monotonic() < end and not second_poll.is_set() and gpu_loop_alive():
            second_poll.wait(0.01)
        return []

    gpu = HeldGpu()
    monitor = Monitor(Config(interval=0.25, urls=()), box_history=False)
    feed = LiveFeed(monitor, gpu_source=gpu, discover=discover)
    try:
        asyncio.run(one_round(monitor, feed))
    finally:
        release.set()
    assert gpu.closed_in_flight == [False], "the GPU source was closed with a second poll in flight"
    assert gpu.polls == 1


def test_one_round_judges_a_refused_port_by_the_log_it_has_read(tmp_path: Path) -> None:
    """A refused port is STARTING or DOWN by what the followed log says of the start when the scrape is
    applied (``Monitor.apply_server``). In one round there is one scrape: when the log's first read came after
    it, the same box said DOWN (exit 2) or STARTING (exit 0) by which thread was first (bench/once_same.py, the
    corpus's startup traces held mid-start). Here the log answers only once the port has been scraped (or after
    0.5 s without a scrape): one round starts its scrapes once the log has answered, so it is STARTING."""
    import asyncio

    from vtop.config import Config
    from vtop.faces.headless import one_round, report
    from vtop.monitor import Monitor
    from vtop.monitor.live import LiveFeed
    from vtop.monitor.monitor import make_log_watch

    log = tmp_path / "vllm.log"  # a CPU start cut after its weights: in memory profiling, not ready
    lines = (Path(__file__).parents[1] / "fixtures" / "logs" / "vllm-0.32.0-cpu-startup.log").read_text().splitlines()
    log.write_text("\n".join(lines[:50]) + "\n")
    cfg = Config(interval=0.25, urls=("http://127.0.0.1:9",), log=str(log))
    monitor = Monitor(cfg, box_history=False)
    lw = make_log_watch(cfg, clock=monitor.clock)
    assert lw is not None
    monitor.log_watch = lw
    read = lw.poll

    def late_read() -> Any:
        end = time.monotonic() + 0.5
        while time.monotonic() < end and not any(ws.polls for ws in list(monitor.servers.values())):
            time.sleep(0.01)
        return read()

    lw.poll = late_read  # type: ignore[method-assign]
    feed = LiveFeed(monitor, gpu_source=None, discover=lambda: [])
    started = asyncio.run(one_round(monitor, feed))
    rep = report(monitor, started, gpu_off=True)
    (server,) = rep.servers
    assert rep.startup is not None and rep.startup["state"] == "starting"
    assert server["state"] == "starting", server["message"]
    assert rep.exit_code == 0


def test_one_round_is_woken_by_each_answer_not_by_its_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The round waits on the sources' answers (``LiveFeed.wake``): a poll thread's result, the process scan,
    a scrape applied. Before, it looked every ``ROUND_STEP_S`` (10 ms) and found the last answer up to a step
    late (8 ms of a 204 ms one-shot on the H100). Here the step is an hour, so only the answers can end the
    round: the process scan answers after the round is waiting, and the scrapes start only then. Nothing is
    timed; the outer bound only turns a hang into a failure."""
    import asyncio

    import vtop.faces.headless as headless
    from vtop.config import Config
    from vtop.model.gpu import GpuPoll
    from vtop.monitor import Monitor
    from vtop.monitor.live import LiveFeed

    monkeypatch.setattr(headless, "ROUND_STEP_S", 3600.0)

    class Gpu:
        def poll(self) -> GpuPoll:
            return GpuPoll(t=time.time(), mono=time.monotonic(), status="absent", message="no GPU here")

        def close(self) -> None:
            pass

    def discover() -> list[Any]:
        time.sleep(0.2)  # the round is waiting by now
        return []

    with MetricsServer(h200_payloads(19, 1)) as srv:
        monitor = Monitor(Config(interval=0.25, urls=(srv.url,)), box_history=False)
        feed = LiveFeed(monitor, gpu_source=Gpu(), discover=discover)

        async def go() -> None:
            await asyncio.wait_for(headless.one_round(monitor, feed), 120)

        asyncio.run(go())
        scrapes = srv.scrapes
    assert feed.gpu_loop is not None and feed.gpu_loop.polls == 1
    assert monitor.discovered_once
    assert scrapes == 1 and monitor.servers[srv.url].polls == 1

