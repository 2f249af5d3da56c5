"""One fleet instance opened (Enter on its row): the same server card and GPU cards as the
local screen, drawn from Prometheus' history (so the sparklines are full at once), its
alerts, and what only the box can tell (``ssh HOST vtop``)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from vtop.core.gpu_history import GpuHistory
from vtop.model.gpu import GpuSample
from vtop.ui.widgets.alerts_panel import FOCUS, AlertsPanel
from vtop.ui.widgets.gpu_panel import GpuPanel
from vtop.ui.widgets.keys_bar import KeysBar
from vtop.ui.widgets.server_panel import ServerCard


class FleetDrill(Screen[None]):
    """``fleet``: the :class:`~vtop.monitor.fleet.Fleet`; ``key``: the row opened."""

    BINDINGS = [
        Binding("escape,backspace", "app.pop_screen", "Back"),
        Binding("e", "app.all_alerts", "Every line"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, fleet: Any, key: str) -> None:
        super().__init__()
        self.fleet = fleet
        self.key = key
        self.drill: Any = None
        self.history = GpuHistory(fleet.config.history)
        self.card: ServerCard | None = None

    def compose(self) -> ComposeResult:
        row = self.fleet.rows[self.key]
        yield Static(f" {row.instance} · job {row.job} · from Prometheus", id="status")
        yield AlertsPanel(id="drill-alerts")
        with VerticalScroll(id="drill-body"):
            interval = self.fleet.refresh_s
            self.card = ServerCard(row.url, window_s=self.fleet.config.history,
                                   max_gap=max(2.5 * interval, interval + 1.0), classes="server-card")
            yield self.card
            yield Static("", id="drill-gpu-msg")
            self.gpus = GpuPanel(self.history, procs_line=self._procs_line, id="gpus")
            self.gpus.max_gap = max(2.5 * interval, interval + 1.0)
            yield self.gpus
        yield Static("", id="drill-box")
        yield KeysBar(id="keys")

    def _procs_line(self, g: GpuSample) -> str:
        return "processes: only on the box"

    async def on_mount(self) -> None:
        self.query_one("#drill-alerts", AlertsPanel).set_level(FOCUS)
        await self.reload()

    async def reload(self) -> None:
        """The tracker's view now and the host's GPUs from ``query_range`` (the app calls this
        after every refresh while the screen is open)."""
        if self.key not in self.fleet.rows:
            return
        d = await self.fleet.drill(self.key)
        self.drill = d
        row = d.row
        self.query_one("#drill-alerts", AlertsPanel).show_alerts(list(row.alerts))
        now = self.fleet.clock.monotonic()
        if self.card is not None and d.view is not None:
            self.card.show(d.view, now)
        # the GPU panel keeps its history object: swap the tracks in
        self.history.tracks = d.gpus.tracks
        self.history.last_poll = d.gpus.last_poll
        msg = self.query_one("#drill-gpu-msg", Static)
        if d.error:
            msg.update(f"GPUs: Prometheus: {d.error}")
        elif not d.gpus.tracks:
            msg.update(f"GPUs: no DCGM exporter series for host {row.host} (Hostname or instance) in Prometheus")
        else:
            msg.update(f"GPUs of {row.gpus.host if row.gpus else row.host} from dcgm-exporter "
                       f"(every {self.fleet.refresh_s:g} s from Prometheus)")
        poll = d.gpus.last_poll
        self.gpus.update_view(poll.mono if poll is not None else now)
        self.query_one("#drill-box", Static).update(
            f"Only on the box (`ssh {row.host} vtop`): the vLLM log (the request named, its max_tokens; the "
            "startup phase; OOM lines), py-spy dumps (d), GPU processes, clocks and throttling.")
