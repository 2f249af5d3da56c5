"""Regenerate the screenshots in screenshots/ (deterministic: all from recordings).

    python -m tools.make_screenshots

Every SVG directly under screenshots/ is made here, from vtop's own recordings of
real runs (the H200 demo, the H200 NVML session, the real vLLM CPU incidents), so
one command brings them all up to the code; tests/unit/test_screenshots_current.py
fails when one of them shows another footer or panel titles than the app does now.
Screenshots of live runs that no recording can replay (a py-spy dump, a test
request, a stalled start on the CPU server) are kept in screenshots/live-runs/,
with the build that took them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers import h200_replay as rp
from vtop.config import Config
from vtop.ui.app import VtopApp

OUT = Path(__file__).resolve().parent.parent / "screenshots"


async def h200(until_t: float, name: str, size: tuple[int, int] = (120, 36)) -> None:
    clock = rp.make_clock()
    app = VtopApp(Config(history=180), gpu_source=None, autopoll=False, hostname="h200 (replay)", clock=clock)
    async with app.run_test(size=size) as pilot:
        await rp.feed(app, clock, until_t=until_t)
        await pilot.pause()
        app.save_screenshot(str(OUT / name))
    print("wrote", OUT / name)


async def demo(offsets: list[tuple[str, float, str, tuple[int, int]]]
               | list[tuple[str, float, str, tuple[int, int], tuple[str, ...]]]) -> None:
    """Screens of `vtop demo` (vtop's own recording of vLLM 0.26.0 on the H200) at times
    relative to the recipe's events (tests/fixtures/h200-demo/events.jsonl)."""
    import json

    from vtop.faces.demo import demo_path
    from vtop.ui.replay import replay_app

    ev: dict[str, float] = {}
    for line in (Path(__file__).parent.parent / "tests" / "fixtures" / "h200-demo" / "events.jsonl").read_text().splitlines():
        d = json.loads(line)
        ev.setdefault(d["ev"], float(d["t"]))
    for event, plus, name, size, *more in offsets:
        keys: tuple[str, ...] = tuple(more[0]) if more else ()
        app = replay_app(str(demo_path()), config=Config(), name="demo", demo=True)
        async with app.run_test(size=size) as pilot:
            app.replay.paused = True
            await pilot.pause()
            app.replay.seek(ev[event] + plus - app.replay.clock.offset)
            await pilot.pause()
            if name.startswith("requests"):
                keys = ("r",)
            for k in keys:
                await pilot.press(k)
                await pilot.pause(0.3)
            app.save_screenshot(str(OUT / name))
        print("wrote", OUT / name)


async def nvml_session(phase_end: str, name: str, size: tuple[int, int] = (120, 30)) -> None:
    """vtop's own NVML recording of a real H200 (tools/device/h200_nvml_session.py): idle,
    a bf16 matmul loop, a tiny-kernel loop; the screen at the end of ``phase_end``."""
    from tests.helpers.h200_session import phases
    from vtop.sources.recording.record import ReplayGpuSource

    ph = phases()
    names = list(ph)
    polls = [p for n in names[: names.index(phase_end) + 1] for p in ph[n]]
    app = VtopApp(Config(history=60), gpu_source=ReplayGpuSource(polls), autopoll=False, hostname="h200 (recorded)",
                  log_watch=None, discover=lambda: [])
    async with app.run_test(size=size) as pilot:
        for _ in polls:
            await app.poll_gpu_once()
        await pilot.pause()
        app.save_screenshot(str(OUT / name))
    print("wrote", OUT / name)


async def cpu_incident(recording: str, name: str, *, after_alert: float, keys: tuple[str, ...] = (),
                       size: tuple[int, int] = (120, 40), rule: str | None = None) -> None:
    """A real vLLM CPU server incident recorded by the real tier (tests/fixtures/cpu-incidents/),
    replayed with that test's thresholds; ``after_alert`` seconds after the ``rule``'s alert
    first shows (without a rule: that many seconds into it)."""
    from vtop.core.rules import Thresholds
    from vtop.ui.replay import replay_app

    path = Path(__file__).parent.parent / "tests" / "fixtures" / "cpu-incidents" / recording
    app = replay_app(str(path), config=Config(runaway_threshold=30.0), name=recording)
    app.diagnoser.thresholds = Thresholds(runaway_s=30.0, engine_stall_s=8.0)
    async with app.run_test(size=size) as pilot:
        d = app.replay
        assert d is not None
        d.paused = True
        await pilot.pause()
        first = None
        while rule is not None and d.pos < d.end and first is None:
            d.seek(d.pos + 1.0)
            if any(a.rule == rule for a in app.alerts):
                first = d.pos
        d.seek((first if first is not None else d.start) + after_alert)
        await _shoot(app, pilot, keys, name)


async def _shoot(app: Any, pilot: Any, keys: tuple[str, ...], name: str, out: Path = OUT) -> None:
    """Press ``keys``, then save the screen as ``out/NAME`` (``screenshots/`` by default)."""
    await pilot.pause()
    for k in keys:
        await pilot.press(k)
        await pilot.pause(0.3)
    app.save_screenshot(str(out / name))
    print("wrote", out / name)


async def replay_until(rec: Path, name: str, size: tuple[int, int], until: Callable[[Any], bool], *,
                       title: str | None = None, step_s: float = 0.5, after_s: float = 1.0,
                       keys: tuple[str, ...] = (), out: Path = OUT) -> bool:
    """A recording replayed (paused, stepped by ``step_s``) to the first moment ``until(app)`` holds, then
    ``after_s`` more (so what it shows has drawn), ``keys`` pressed, saved as ``out/NAME``. False, and nothing
    written, when the recording never gets there."""
    from vtop.ui.replay import replay_app

    app = replay_app(str(rec), config=Config(), name=title or rec.name)
    async with app.run_test(size=size) as pilot:
        d = app.replay
        assert d is not None
        d.paused = True
        await pilot.pause()
        while d.pos < d.end and not until(app):
            d.seek(d.pos + step_s)
        if not until(app):
            print(f"{rec}: never got there: {name} not made")
            return False
        if after_s:
            d.seek(d.pos + after_s)
        await _shoot(app, pilot, keys, name, out)
    return True


async def corpus_trace(trace: str, name: str, *, after_event: str, offset_s: float, keys: tuple[str, ...] = (),
                       size: tuple[int, int] = (120, 40), attach_s: float | None = None,
                       with_log: bool | None = None) -> None:
    """A trace of the incident corpus (tests/corpus/traces/), replayed with default settings to
    ``offset_s`` after its ``after_event`` event (``runaway_begin``...); with ``attach_s``, as vtop
    started ``attach_s`` after that event would have seen it (a late look: the log before read at once);
    ``with_log=False``: without its log (vLLM's output on a pipe, in a container)."""
    import json

    from vtop.ui.replay import replay_app

    path = Path(__file__).parent.parent / "tests" / "corpus" / "traces" / trace
    at = next(float(e["t"]) for e in map(json.loads, (path / "events.jsonl").read_text().splitlines())
              if e.get("what") == after_event)
    attach = None
    if attach_s is not None:
        mono = next(float(e["mono"]) for e in map(json.loads, (path / "events.jsonl").read_text().splitlines())
                    if e.get("what") == after_event)
        attach = mono + attach_s
    app = replay_app(str(path), config=Config(), name=trace, attach_at=attach, with_log=with_log)
    async with app.run_test(size=size) as pilot:
        d = app.replay
        assert d is not None
        d.paused = True
        await pilot.pause()
        d.seek(at + offset_s - d.clock.offset)
        await _shoot(app, pilot, keys, name)


async def late_look() -> None:
    for name, size in (("late-look-cpu-runaway.svg", (120, 40)), ("late-look-cpu-runaway-80x24.svg", (80, 24))):
        await corpus_trace("runaway-with-short-traffic-clock-minus8h", name, after_event="load_begin",
                           offset_s=190.0, attach_s=180.0, size=size)
    # the second run's load began 78 s after the first's: vtop started 15 s into it
    await corpus_trace("restart-counter-reset", "late-look-cpu-restart-timeline.svg", after_event="load_begin",
                       offset_s=103.0, attach_s=93.0, keys=("h",))


async def cpu_signals(name: str, *, size: tuple[int, int], keys: tuple[str, ...] = ()) -> None:
    """Issue #29's rows of a server card: the real CPU server with n-gram speculative decoding and
    prefix caching under a load of repeated prompts (tests/real/test_real_signals.py's recording),
    a second after the card first shows an acceptance over 20,000 draft tokens (mid-load)."""

    def shown(app: Any) -> bool:
        e = next(iter(app.monitor.servers.values()), None)
        v = e.last_view if e is not None else None
        return v is not None and v.spec is not None and (v.spec.draft_tokens or 0) > 20000

    rec = "spec-prefix-load.jsonl.gz"
    await replay_until(Path(__file__).parent.parent / "tests" / "fixtures" / "cpu-incidents" / rec, name, size, shown,
                       title=rec, keys=keys)


async def h200_sleep(name: str, *, size: tuple[int, int]) -> None:
    """A server card SLEEPING: the real vLLM 0.26.0 H200 payloads (tests/fixtures/vllm/signals/h200-0.26.0/
    sleep), 20 s awake then 40 s after ``POST /sleep?level=1``, one scrape a second on a fake clock."""
    from vtop.clock import FakeClock
    from vtop.sources.metrics_text import parse_vllm_metrics
    from vtop.sources.vllm import poll_from_body

    src = Path(__file__).parent.parent / "tests" / "fixtures" / "vllm" / "signals" / "h200-0.26.0" / "sleep"
    clock = FakeClock(start=1000.0, wall_offset=1796199000.0)
    app = VtopApp(Config(history=60), gpu_source=None, autopoll=False, hostname="h200 (recorded payloads)",
                  clock=clock)
    async with app.run_test(size=size) as pilot:
        entry = app.monitor.add_server("http://127.0.0.1:8000", from_cli=True)
        for i in range(60):
            body = (src / ("metrics-0-awake.txt" if i < 20 else "metrics-1-sleep1.txt")).read_text()
            app.apply_server(entry.url, poll_from_body(entry.url, body.encode(), t=clock.time(), mono=clock.monotonic(),
                                                       latency_s=0.003, metrics=parse_vllm_metrics(body)))
            clock.advance(1.0)
        await pilot.pause(0.3)
        app.save_screenshot(str(OUT / name))
    print("wrote", OUT / name)


async def help_live(name: str, size: tuple[int, int] = (100, 40)) -> None:
    """The help screen (? or F1) of the live dashboard, over the H200 replay's screen."""
    clock = rp.make_clock()
    app = VtopApp(Config(history=180), gpu_source=None, autopoll=False, hostname="h200 (replay)", clock=clock)
    async with app.run_test(size=size) as pilot:
        await rp.feed(app, clock, until_t=185)
        await pilot.press("question_mark")
        await pilot.pause(0.3)
        app.save_screenshot(str(OUT / name))
    print("wrote", OUT / name)


#: the third real start on the lent H100 with its history and budget (``python -m tools.make_screenshots h100``)
H100_STARTS = ("startup-h100-history-budget.svg", "startup-h100-history-budget-80x24.svg")


async def h100_starts(name: str, size: tuple[int, int]) -> None:
    """The startup panel of the third real start on a lent H100 (NVIDIA H100 80GB HBM3, vLLM 0.26.0,
    --gpu-memory-utilization 0.8; tests/corpus/traces/h100-starts-history-budget) 0.9 s into its warmup, as a vtop
    that followed it from its launch showed it: the first two starts (0.5, the same model) kept in the start history
    by the same vtop following their logs, the log written as the trace's log index says, the trace's process table,
    server polls and NVML readings at their recorded times (tests/helpers/h100_starts.py)."""
    import os
    import tempfile

    from tests.helpers import h100_starts as H

    old_state = os.environ.get("XDG_STATE_HOME")
    with tempfile.TemporaryDirectory(prefix="vtop-h100-shot-") as tmp:
        os.environ["XDG_STATE_HOME"] = tmp  # the history is this picture's own, not the user's
        try:
            H.keep_first_two()
            log = Path(tmp) / "serve.log"
            app, clock = H.third_start_app(log)
            async with app.run_test(size=size) as pilot:
                await H.feed_third_start(app, clock, log)
                await pilot.pause()
                app.save_screenshot(str(OUT / name))
        finally:
            if old_state is None:
                os.environ.pop("XDG_STATE_HOME", None)
            else:
                os.environ["XDG_STATE_HOME"] = old_state
    print("wrote", OUT / name)


#: a start that failed while vtop could not read its log (tests/corpus/traces/startup-failure-missing-module played
#: without its log), named from its processes
NOLOG_FAILURE = ("startup-failure-nolog-cpu.svg", "startup-failure-nolog-cpu-80x24.svg")


#: the real KV-cache failure on the lent H100 (issue 40): the start at 0.0072 failed, 2 s before the recorder
#: launched the utilization the budget gives (tests/corpus/traces/h100-startup-failure-max-model-len)
H100_KV = ("startup-h100-kv-failure-fit.svg", "startup-h100-kv-failure-fit-80x24.svg")


#: issue 40 on the lent H100 (session 25): the noisy neighbour named beside a 7B-shaped model
#: (tests/corpus/traces/h100-neighbour-gpu-bound, 25 s after the matmuls began), and the runtime OOM of prompt
#: logprobs named by its stage with the startup panel saying it after ready (h100-runtime-oom-prompt-logprobs)
H100_RUNTIME = ("neighbour-h100-alert.svg", "neighbour-h100-alert-80x24.svg", "oom-h100-prompt-logprobs.svg",
                "oom-h100-prompt-logprobs-80x24.svg")


async def h100() -> None:
    await h100_starts(H100_STARTS[0], (120, 40))
    await h100_starts(H100_STARTS[1], (80, 24))
    for name, size in zip(H100_KV, ((120, 40), (80, 24)), strict=True):
        await corpus_trace("h100-startup-failure-max-model-len", name, after_event="fit_launch", offset_s=-2.0,
                           size=size)
    for name, size in zip(H100_RUNTIME[:2], ((120, 40), (80, 24)), strict=True):
        await corpus_trace("h100-neighbour-gpu-bound", name, after_event="neighbour_ready", offset_s=25.0, size=size)
    for name, size in zip(H100_RUNTIME[2:], ((120, 40), (80, 24)), strict=True):
        await corpus_trace("h100-runtime-oom-prompt-logprobs", name, after_event="oom_burst", offset_s=5.0, size=size)


#: two real vLLM servers on one GPU (issue 39; ``python -m tools.make_screenshots two``), recorded by vtop on a lent
#: H100 (session 25, tools/device/h200_two_servers.sh): the screen while the runaway on :8000 and the stopped
#: EngineCore of :8001 are both named, and the process view (P)
TWO_SERVERS_REC = Path(__file__).parent.parent / "tests" / "fixtures" / "h100-two-servers" / "rec.jsonl.gz"
TWO_SERVERS = ("two-servers-h100.svg", "two-servers-h100-80x24.svg", "two-servers-h100-processes.svg",
               "two-servers-h100-gpu-card.svg")


async def two_servers(name: str, size: tuple[int, int], keys: tuple[str, ...] = (), *, load: bool = False) -> None:
    """vtop's own recording of two vLLM 0.26.0 servers on one H100 80GB (tools/device/h200_two_servers.sh, which
    runs on either card), replayed to one second after the first poll at which a runaway alert and a stall alert
    are both up; ``load``: to 5 s into the load on :8000 (32 running), where the GPU card has the room to list
    both EngineCores."""
    def both(app: Any) -> bool:
        rules = {a.rule for a in app.monitor.alerts}
        return "runaway" in rules and bool(rules & {"engine_stall", "stall"})

    def loaded(app: Any) -> bool:
        ws = app.monitor.servers.get("http://127.0.0.1:8000")
        v = ws.last_view if ws is not None else None
        return v is not None and v.metrics is not None and (v.metrics.running or 0) >= 16

    await replay_until(TWO_SERVERS_REC, name, size, loaded if load else both, title="h100-two-servers", keys=keys,
                       after_s=5.0 if load else 1.0)


async def two() -> None:
    if not TWO_SERVERS_REC.exists():
        print("no", TWO_SERVERS_REC, "(made on the GPU machine by tools/device/h200_two_servers.sh): skipped")
        return
    await two_servers(TWO_SERVERS[0], (120, 40))
    await two_servers(TWO_SERVERS[1], (80, 24))
    await two_servers(TWO_SERVERS[2], (120, 40), keys=("P",))
    await two_servers(TWO_SERVERS[3], (120, 40), load=True)


#: the real SGLang 0.5.17 on a lent H100 (issue 42; ``python -m tools.make_screenshots sglang``), from vtop's own
#: recording of h200-sglang-launch-burst-runaway (tools/device/h200_sglang.sh, call A; session 26): the startup panel during CUDA graph
#: capture, the server card while the burst of 600 queues behind --max-running-requests 64, the runaway named
SGLANG_REC = Path(__file__).parent.parent / "tests" / "fixtures" / "h100-sglang" / "rec.jsonl.gz"
SGLANG_URL = "http://127.0.0.1:30000"
SGLANG = (("sglang-h100-startup.svg", (120, 40), "capture"), ("sglang-h100-startup-80x24.svg", (80, 24), "capture"),
          ("sglang-h100-burst.svg", (120, 40), "queue"), ("sglang-h100-burst-80x24.svg", (80, 24), "queue"),
          ("sglang-h100-runaway.svg", (120, 40), "runaway"))


def _sglang_moment(app: Any, moment: str, url: str) -> bool:
    """Whether the replayed screen is at ``moment``: ``capture`` (the startup tracker's current phase is CUDA
    graph capture), ``queue`` (the server card's total shows requests waiting), ``runaway`` (its alert is up)."""
    from vtop.core.phases.types import Phase

    m = app.monitor
    if moment == "capture":
        return m.log_view is not None and m.log_view.snapshot.current is Phase.CUDA_GRAPHS
    if moment == "queue":
        v = m.views().get(url)
        return v is not None and v.total is not None and bool(v.total.waiting)
    return any(a.rule == "runaway" for a in m.alerts)


async def sglang_shot(name: str, size: tuple[int, int], moment: str, *, rec: Path = SGLANG_REC,
                      url: str = SGLANG_URL, out: Path = OUT) -> bool:
    """vtop's own recording of SGLang on the GPU machine, replayed to the first quarter second at ``moment``
    (:func:`_sglang_moment`; the queue and the runaway one second later, so the card and the alert have drawn);
    saved as ``out/name``. False (nothing written) when the recording never reaches that moment."""
    return await replay_until(rec, name, size, lambda app: _sglang_moment(app, moment, url), title="h100-sglang",
                              step_s=0.25, after_s=0.0 if moment == "capture" else 1.0, out=out)


async def sglang(rec: Path = SGLANG_REC, out: Path = OUT, url: str = SGLANG_URL) -> None:
    if not rec.exists():
        print("no", rec, "(made on the H200 by tools/device/h200_sglang.sh): skipped")
        return
    for name, size, moment in SGLANG:
        await sglang_shot(name, size, moment, rec=rec, url=url, out=out)


#: what main() writes: tests/unit/test_screenshots_current.py checks each against the live app
MADE = (
    "demo-h200-startup-cuda-graphs.svg", "demo-h200-burst.svg", "demo-h200-runaway-alert.svg",
    "demo-h200-runaway-alert-80x24.svg", "demo-h200-runaway-alert-e.svg", "demo-h200-runaway-alert-e-80x24.svg",
    "demo-h200-help.svg", "requests-h200-real-runaway.svg", "help-live.svg", "demo-h200-processes.svg",
    "h200-replay-burst.svg", "h200-replay-runaway.svg", "h200-replay-burst-80x24.svg",
    "gpu-h200-real-matmul.svg", "gpu-h200-real-tiny-kernels.svg",
    "alerts-cpu-real-runaway.svg", "requests-cpu-real-runaway.svg", "alerts-cpu-real-engine-stall.svg",
    "server-cpu-real-load.svg",
    "server-cpu-real-spec-prefix.svg", "server-cpu-real-spec-prefix-detail.svg",
    "server-cpu-real-spec-prefix-80x24.svg", "server-cpu-real-spec-prefix-detail-80x24.svg",
    "server-h200-sleeping.svg", "server-h200-sleeping-80x24.svg",
    "requests-h200-conns-runaway.svg", "requests-h200-conns-runaway-80x24.svg",
    "late-look-cpu-runaway.svg", "late-look-cpu-runaway-80x24.svg", "late-look-cpu-restart-timeline.svg",
    *NOLOG_FAILURE, *H100_STARTS, *H100_KV, *H100_RUNTIME, *TWO_SERVERS, *(name for name, _, _ in SGLANG),
)


def tmux_captures() -> None:
    """The real tier's tmux captures kept in screenshots/live-runs/ (``NAME.ansi``, from
    ``tmux capture-pane -p -e``, written by a real test with ``VTOP_SCREENSHOTS=DIR``) drawn
    as SVG beside them (``NAME.svg``) with Rich, the terminal's own text and colours."""
    import io

    from rich.console import Console
    from rich.text import Text

    for src in sorted((OUT / "live-runs").glob("*.ansi")):
        rows = src.read_text().rstrip("\n").split("\n")
        width = max(len(Text.from_ansi(r).plain) for r in rows)
        con = Console(record=True, width=width, file=io.StringIO(), force_terminal=True, color_system="truecolor")
        for r in rows:
            con.print(Text.from_ansi(r), no_wrap=True, overflow="crop")
        dst = src.with_suffix(".svg")
        con.save_svg(str(dst), title=f"vtop in tmux ({width}x{len(rows)}): {src.stem}")
        print("wrote", dst)


async def main() -> None:
    await demo([
        ("vllm_launch", 62.0, "demo-h200-startup-cuda-graphs.svg", (120, 40)),
        ("load_b_begin", 6.0, "demo-h200-burst.svg", (120, 40)),
        ("runaway_begin", 150.0, "demo-h200-runaway-alert.svg", (120, 40)),
        ("runaway_begin", 150.0, "demo-h200-runaway-alert-80x24.svg", (80, 24)),
        ("runaway_begin", 150.0, "demo-h200-runaway-alert-e.svg", (120, 40), ("e",)),
        ("runaway_begin", 150.0, "demo-h200-runaway-alert-e-80x24.svg", (80, 24), ("e",)),
        ("runaway_begin", 150.0, "demo-h200-help.svg", (100, 40), ("question_mark",)),
        ("runaway_begin", 150.0, "requests-h200-real-runaway.svg", (120, 40)),
        ("runaway_begin", 150.0, "demo-h200-processes.svg", (120, 30), ("P",)),
    ])
    await help_live("help-live.svg")
    await h200(108.5, "h200-replay-burst.svg")
    await h200(185, "h200-replay-runaway.svg")
    await h200(108.5, "h200-replay-burst-80x24.svg", size=(80, 24))
    await nvml_session("heavy", "gpu-h200-real-matmul.svg")
    await nvml_session("tiny", "gpu-h200-real-tiny-kernels.svg")
    await cpu_incident("runaway.jsonl.gz", "alerts-cpu-real-runaway.svg", after_alert=1.0, rule="runaway")
    await cpu_incident("runaway.jsonl.gz", "requests-cpu-real-runaway.svg", after_alert=1.0, keys=("r",),
                       rule="runaway")
    await cpu_incident("engine-stall.jsonl.gz", "alerts-cpu-real-engine-stall.svg", after_alert=0.0,
                       rule="engine_stall")
    await cpu_incident("normal-load.jsonl.gz", "server-cpu-real-load.svg", after_alert=95.0)
    await cpu_signals("server-cpu-real-spec-prefix.svg", size=(120, 40))
    await cpu_signals("server-cpu-real-spec-prefix-detail.svg", size=(120, 40), keys=("i",))
    await cpu_signals("server-cpu-real-spec-prefix-80x24.svg", size=(80, 24))
    await cpu_signals("server-cpu-real-spec-prefix-detail-80x24.svg", size=(80, 24), keys=("i",))
    await h200_sleep("server-h200-sleeping.svg", size=(120, 40))
    await h200_sleep("server-h200-sleeping-80x24.svg", size=(80, 24))
    # request logging off: the runaway's connection, from the kernel's counters (issue 24's last trace)
    await corpus_trace("h200-runaway-short-traffic-2", "requests-h200-conns-runaway.svg",
                       after_event="runaway_begin", offset_s=55.0, keys=("r",))
    await corpus_trace("h200-runaway-short-traffic-2", "requests-h200-conns-runaway-80x24.svg",
                       after_event="runaway_begin", offset_s=55.0, keys=("r",), size=(80, 24))
    # a start that failed while vtop could not read its log (the real CPU server, a missing package): named from
    # its processes, gone before its port ever answered
    for name, size in zip(NOLOG_FAILURE, ((120, 40), (80, 24)), strict=True):
        await corpus_trace("startup-failure-missing-module", name, after_event="server_exit", offset_s=8.0,
                           size=size, with_log=False)
    # a late look (issue #45): vtop started 3 minutes into the load, the log's clock 8 h behind; the charts
    # before it from the log's stats lines; then the log's timeline (h) of a server restarted in place
    await late_look()
    await h100()
    await two()
    await sglang()
    tmux_captures()
    await fleet()


FLEET_OUT = OUT / "fleet"
#: the fleet screen's pictures (``python -m tools.make_screenshots fleet``), from the answers a real
#: Prometheus 2.42 gave (tests/fixtures/prometheus/fleet-4.json); in a folder of their own, since
#: their footer is the fleet screen's, not the box's
FLEET_MADE = ("fleet-160x50.svg", "fleet-80x24.svg", "fleet-drill-160x50.svg", "fleet-drill-80x24.svg")


async def fleet() -> None:
    from tests.helpers.prom_replay import PromReplay, clock_at, load
    from vtop.monitor.fleet import Fleet
    from vtop.sources.prometheus import PromClient
    from vtop.ui.fleet_app import FleetApp

    rec = load()
    FLEET_OUT.mkdir(exist_ok=True)
    with PromReplay(rec) as pr:
        for w, h in ((160, 50), (80, 24)):
            cfg = Config()
            app = FleetApp(cfg, fleet=Fleet(cfg, PromClient(pr.url), clock=clock_at(rec)), autorefresh=False)
            async with app.run_test(size=(w, h)) as pilot:
                await app.first()
                await pilot.pause()
                app.save_screenshot(str(FLEET_OUT / f"fleet-{w}x{h}.svg"))
                await pilot.press("end", "up", "enter")  # the runaway's row (worst first: after the criticals)
                for _ in range(50):
                    if getattr(app.screen, "drill", None) is not None:
                        break
                    await pilot.pause(0.1)
                await pilot.pause()
                app.save_screenshot(str(FLEET_OUT / f"fleet-drill-{w}x{h}.svg"))
    print("wrote", ", ".join(str(FLEET_OUT / n) for n in FLEET_MADE))


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["fleet"]:  # only the fleet screen's pictures
        asyncio.run(fleet())
    elif sys.argv[1:] == ["h100"]:  # only the H100 starts' startup panel (issue 40)
        asyncio.run(h100())
    elif sys.argv[1:] == ["two"]:  # only the two servers on one GPU (issue 39; recorded on an H100)
        asyncio.run(two())
    elif sys.argv[1:2] == ["sglang"]:  # only SGLang on the H200 (issue 42); [REC OUTDIR URL]: another recording
        more = sys.argv[2:5]
        asyncio.run(sglang(*(Path(x) for x in more[:2]), *more[2:]))  # type: ignore[arg-type]
    elif sys.argv[1:] == ["--signals"]:  # only issue #29's card screenshots
        async def _signals() -> None:
            await cpu_signals("server-cpu-real-spec-prefix.svg", size=(120, 40))
            await cpu_signals("server-cpu-real-spec-prefix-detail.svg", size=(120, 40), keys=("i",))
            await cpu_signals("server-cpu-real-spec-prefix-80x24.svg", size=(80, 24))
            await cpu_signals("server-cpu-real-spec-prefix-detail-80x24.svg", size=(80, 24), keys=("i",))
            await h200_sleep("server-h200-sleeping.svg", size=(120, 40))
            await h200_sleep("server-h200-sleeping-80x24.svg", size=(80, 24))

        asyncio.run(_signals())
    else:
        asyncio.run(main())
