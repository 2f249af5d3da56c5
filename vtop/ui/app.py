"""The Textual application: layout, keys, and the routing of poll results.

Sources are injected (``gpu_source``) and polling can be switched off
(``autopoll=False``) so tests drive the app tick by tick with
:meth:`VtopApp.poll_gpu_once`; in production each source runs in its own
one-shot timer chain (:mod:`vtop.ui.polling`).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Protocol

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from vtop import __version__
from vtop.config import Config
from vtop.core.gpu_history import GpuHistory
from vtop.sources.gpu import ABSENT, OFF, GpuPoll, GpuSample
from vtop.sources.procs import ProcNames
from vtop.sources.record import Recorder
from vtop.ui.polling import PollLoop
from vtop.ui.widgets.gpu_panel import GpuPanel

GIB = 2**30
SERVER_PANEL_MIN_ROWS = 6


class GpuSourceLike(Protocol):
    def poll(self) -> GpuPoll: ...
    def close(self) -> None: ...


def make_gpu_source(config: Config) -> GpuSourceLike | None:
    if config.no_gpu:
        return None
    from vtop.sources.nvml import NvmlSource

    if config.simulate_gpus:
        from vtop.sources.fake_nvml import simulated

        return NvmlSource(simulated(config.simulate_gpus))
    return NvmlSource()


class VtopApp(App[int]):
    CSS_PATH = "vtop.tcss"
    TITLE = "vtop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("c", "toggle_compact", "Compact"),
    ]

    def __init__(
        self,
        config: Config,
        *,
        gpu_source: GpuSourceLike | None | str = "auto",
        autopoll: bool = True,
        hang_after_s: float | None = None,
        hostname: str | None = None,
    ) -> None:
        super().__init__()
        self.hostname = hostname or socket.gethostname()
        self.config = config
        if config.theme:
            self.theme = config.theme
        self.gpu_source: GpuSourceLike | None = (
            make_gpu_source(config) if isinstance(gpu_source, str) else gpu_source
        )
        self.autopoll = autopoll
        self.hang_after_s = hang_after_s if hang_after_s is not None else max(3.0, 3 * config.interval)
        self.gpu_history = GpuHistory(config.history)
        self.proc_names: dict[int, str] = {}
        self._names = ProcNames()
        self.recorder = Recorder(config.record) if config.record else None
        self.gpu_loop: PollLoop | None = None
        self.gpu_hung = False
        self._status_text = ""

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        with VerticalScroll(id="body"):
            yield GpuPanel(self.gpu_history, procs_line=self.procs_line, id="gpus")
            yield Static("", id="servers")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#servers", Static).update(
            "vLLM: no server watched yet (server panels are not built in this version)"
        )
        if self.gpu_source is None:
            self._apply_gpu(GpuPoll(t=0.0, mono=0.0, status=OFF, message="GPU panel off (--no-gpu)."))
        self._size_panels()
        self.update_status()
        if self.autopoll:
            if self.gpu_source is not None:
                self.gpu_loop = PollLoop(self, "gpu", self.config.interval, self._gpu_poll_blocking, self._on_gpu_result)
                self.gpu_loop.start()
            self.set_interval(1.0, self._watchdog, name="watchdog")

    def on_resize(self) -> None:
        self._size_panels()

    def _size_panels(self) -> None:
        panel = self.query_one(GpuPanel)
        panel.max_gap = max(2.5 * self.config.interval, self.config.interval + 1.0)
        panel.max_height = max(1, self.size.height - 2 - SERVER_PANEL_MIN_ROWS)
        panel.relayout()

    # ----------------------------------------------------------------- polling
    def _gpu_poll_blocking(self) -> tuple[GpuPoll, dict[int, str]]:
        """Runs in a thread worker: NVML, psutil and the recorder's file I/O."""
        assert self.gpu_source is not None
        poll = self.gpu_source.poll()
        pids = sorted({p.pid for g in poll.gpus for p in (g.procs or ())})
        names = self._names.names(pids) if pids else {}
        if self.recorder is not None:
            self.recorder.gpu(poll)
        return poll, names

    def _on_gpu_result(self, result: Any, error: BaseException | None) -> None:
        if error is not None:
            poll = GpuPoll(t=0.0, mono=0.0, status="error", message=f"GPU poll failed: {type(error).__name__}: {error}")
            self._apply_gpu(poll)
            return
        poll, names = result
        self.proc_names = names
        self._apply_gpu(poll)

    async def poll_gpu_once(self) -> GpuPoll | None:
        """Tests and replays: one poll through a real thread, applied on the UI thread."""
        if self.gpu_source is None:
            return None
        result = await asyncio.to_thread(self._gpu_poll_blocking)
        self._on_gpu_result(result, None)
        return result[0]

    def _apply_gpu(self, poll: GpuPoll) -> None:
        if poll.status in (ABSENT, OFF) or poll.gpus:
            self.gpu_history.add(poll)
        panel = self.query_one(GpuPanel)
        self.gpu_hung = False
        if panel.has_class("-stale"):
            panel.remove_class("-stale")
        with self.batch_update():
            panel.update_view(poll.mono)
        self.update_status()

    def _watchdog(self) -> None:
        loop = self.gpu_loop
        if loop is None:
            return
        hung = loop.in_flight_for() > self.hang_after_s
        if hung or self.gpu_hung:
            self.gpu_hung = hung
            self.query_one(GpuPanel).set_class(hung, "-stale")
            self.update_status()

    # ------------------------------------------------------------------ status
    def gpu_status_text(self) -> str:
        poll = self.gpu_history.last_poll
        if self.gpu_hung and self.gpu_loop is not None:
            return f"NVML not answering for {self.gpu_loop.in_flight_for():.0f} s (GPU readings are stale)"
        if poll is None:
            return "GPU: starting NVML…"
        if poll.status == OFF:
            return "GPU: off"
        if poll.status == ABSENT:
            return "GPU: none"
        names = {g.name for g in poll.gpus}
        kind = names.pop() if len(names) == 1 else "mixed"
        txt = f"{len(poll.gpus)} × {kind}"
        if poll.driver:
            txt += f" · driver {poll.driver.split()[0]}"
        lost = sum(1 for g in poll.gpus if g.lost)
        if lost:
            txt += f" · {lost} LOST"
        return txt

    def update_status(self) -> None:
        text = f" vtop {__version__} │ {self.hostname} │ {self.gpu_status_text()} │ every {self.config.interval:g} s"
        if text != self._status_text:
            self._status_text = text
            self.query_one("#status", Static).update(text)

    def procs_line(self, g: GpuSample) -> str:
        if not g.procs:
            return "no compute process" if g.procs is not None else ""
        parts = []
        for p in sorted(g.procs, key=lambda p: -(p.used_bytes or 0))[:3]:
            name = self.proc_names.get(p.pid, "")
            mem = "" if p.used_bytes is None else f" {p.used_bytes / GIB:.1f} GiB"
            parts.append(f"{name} {p.pid}{mem}".strip())
        more = len(g.procs) - 3
        if more > 0:
            parts.append(f"+{more}")
        return " · ".join(parts)

    # ----------------------------------------------------------------- actions
    def action_toggle_compact(self) -> None:
        self.query_one(GpuPanel).toggle_compact()

    async def action_quit(self) -> None:
        self.exit(0)

    def on_unmount(self) -> None:
        if self.gpu_loop is not None:
            self.gpu_loop.stop()
        if self.recorder is not None:
            self.recorder.close()
