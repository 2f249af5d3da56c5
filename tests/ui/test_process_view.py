"""``P``: the process view (issue 26, item 10): GPU processes and each vLLM server's tree folded together."""

from __future__ import annotations

import os

from tests.helpers.demo_h200 import EV, seek_wall
from tests.helpers.screen_text import screen_text
from vtop.clock import FakeClock
from vtop.config import Config
from vtop.faces.demo import demo_path
from vtop.model.gpu import GpuPoll, GpuProcess, GpuSample
from vtop.ui.app import VtopApp
from vtop.ui.replay import replay_app
from vtop.ui.screens import ProcessScreen

GIB = 2**30


def table_rows(app) -> list[list[str]]:  # type: ignore[no-untyped-def]
    from textual.widgets import DataTable

    t = app.screen.query_one("#proc-table", DataTable)
    return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]


async def test_demo_folds_the_vllm_tree_under_its_server_with_gpu_memory() -> None:
    app = replay_app(str(demo_path()), config=Config(), name="demo")
    async with app.run_test(size=(140, 30)) as pilot:
        app.replay.paused = True  # type: ignore[union-attr]
        await pilot.pause()
        seek_wall(app, EV["runaway_begin"] + 60)
        await pilot.press("P")
        await pilot.pause()
        assert isinstance(app.screen, ProcessScreen)
        rows = table_rows(app)
        text = screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ProcessScreen)
    head = rows[0]
    assert head[0] == "vLLM :8000" and head[2] == "http://127.0.0.1:8000" and head[4] == "70.9 GiB"
    engine = next(r for r in rows if r[0] == "792")
    assert "EngineCore" in engine[1] and engine[3] == "0" and engine[4] == "70.9 GiB"
    assert any(r[0] == "661" and "API server" in r[1] for r in rows)
    assert engine[7] == "-" and engine[8] == "-"  # a replay: this box's /proc is not the recorded one
    assert "EngineCore" in text


async def test_live_rows_read_the_process_and_sort() -> None:
    clock = FakeClock()
    me = os.getpid()
    app = VtopApp(Config(no_gpu=True), gpu_source=None, autopoll=False, hostname="t", clock=clock, log_watch=None)
    async with app.run_test(size=(160, 30)) as pilot:
        procs = (GpuProcess(me, 2 * GIB, 37.0), GpuProcess(1, 5 * GIB))
        app.apply_gpu(GpuPoll(t=clock.time(), mono=clock.monotonic(), status="ok",
                              gpus=(GpuSample(index=0, name="NVIDIA H200", procs=procs),)))
        await pilot.press("P")
        await pilot.pause()
        rows = table_rows(app)
        assert [r[0] for r in rows] == ["1", str(me)]  # by GPU memory, largest first
        mine = rows[1]
        assert mine[4] == "2.0 GiB" and mine[7].endswith("GiB") and "python" in mine[9].lower()
        assert mine[5] == "37" and rows[0][5] == "-"  # its share of the SMs; none read for pid 1
        await pilot.press("i")
        await pilot.pause()
        assert [r[0] for r in table_rows(app)] == ["1", str(me)]  # by PID, smallest first
        await pilot.press("m")
        await pilot.pause()
        assert table_rows(app)[0][4] == "5.0 GiB"


async def test_a_containers_server_is_named_on_the_gpu_card_and_in_p_at_120x40_and_80x24() -> None:
    """Issue 39: the GPU card's process line and ``P`` say where a server runs (``container vllm-0``) and
    ``P`` gives each process's PID in its container beside the host's; the same at 80x24."""
    import dataclasses

    from tests.helpers.containers import server
    from vtop.model.procs import VllmChild

    clock = FakeClock()
    url = "http://127.0.0.1:18000"
    eng = VllmChild(27700, 27650, "VLLM::EngineCore", "engine", None, (), 1.0, holds_gpu=True, ns_pid=245)
    sp = dataclasses.replace(server(27650, children=(eng,)), port=18000, url=url, placement="container vllm-0",
                             ns_pid=1, own_netns=True, listen_port=8000, published=("127.0.0.1:18000",))
    for size in ((120, 40), (80, 24)):
        app = VtopApp(Config(urls=(url,)), gpu_source=None, autopoll=False, hostname="t", clock=clock,
                      log_watch=None)
        async with app.run_test(size=size) as pilot:
            app.apply_procs([sp])
            app.apply_gpu(GpuPoll(t=clock.time(), mono=clock.monotonic(), status="ok",
                                  gpus=(GpuSample(index=0, name="NVIDIA H200", mem_used=60 * GIB, mem_total=141 * GIB,
                                                  procs=(GpuProcess(27700, 56 * GIB),)),)))
            await pilot.pause()
            line = app.procs_line(app.monitor.gpu_history.last_poll.gpus[0])  # type: ignore[union-attr]
            assert line == "EngineCore of :18000 · container vllm-0 27700 56.0 GiB", line
            assert "container vllm-0" in screen_text(app)
            await pilot.press("P")
            await pilot.pause()
            rows = table_rows(app)
            text = screen_text(app)
        assert rows[0][0] == "vLLM :18000" and rows[0][1] == "2 processes · container vllm-0", rows[0]
        engine = next(r for r in rows if "EngineCore" in r[1])
        assert engine[0] == "27700 (245)" and engine[4] == "56.0 GiB", engine
        assert next(r for r in rows if "API server" in r[1])[0] == "27650 (1)"
        assert "27700 (245)" in text


async def test_the_log_pane_names_a_runtimes_log() -> None:
    """Issue 39: a log vtop found kept by a container runtime is named on the log pane ("log · docker
    json-file of fx1"); a plain file is just "log"."""
    from tests.conftest import FIXTURES
    from vtop.monitor.logwatch import LogWatch
    from vtop.sources.logformats import DockerJsonDecoder
    from vtop.sources.logtail import LogTailer

    clock = FakeClock()
    src = LogTailer(FIXTURES / "containers" / "docker-json-file.log", decoder=DockerJsonDecoder(),
                    label="docker json-file of fx1")
    app = VtopApp(Config(no_gpu=True), gpu_source=None, autopoll=False, hostname="t", clock=clock,
                  log_watch=LogWatch(src, clock=clock))
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        pane = app.query_one("#log")
        assert str(pane.border_title).startswith("log · docker json-file of fx1"), pane.border_title
        assert "partial without newline then its end" in screen_text(app)
