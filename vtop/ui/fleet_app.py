"""``vtop --prometheus URL``: the fleet screen.

A status line (Prometheus, instances, queries per refresh, how old the data is, and
Prometheus' error in words when it fails), the alerts worst first, the fleet table
(:mod:`vtop.ui.widgets.fleet_table`), and one line saying what only the box knows. Enter
opens an instance (:mod:`vtop.ui.widgets.fleet_drill`). The refresh runs in the event
loop with a deadline per query and never overlaps itself: a slow Prometheus shows as
``STALE`` rows and its error, never a frozen screen.
"""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Input, Static

from vtop.clock import Clock
from vtop.config import Config
from vtop.model.fmt import dur
from vtop.monitor.fleet import Fleet, client_from_config
from vtop.ui.screens import AlertsScreen
from vtop.ui.widgets.alerts_panel import FOCUS, TITLES, AlertsPanel
from vtop.ui.widgets.fleet_drill import FleetDrill
from vtop.ui.widgets.fleet_table import FleetTable
from vtop.ui.widgets.keys_bar import KeysBar

BOX_LINE = ("Prometheus cannot tell: the vLLM log (which request runs away, the startup phase, OOM lines), "
            "py-spy dumps, GPU processes: on the box, `ssh HOST vtop`.")


class FleetApp(App[int]):
    CSS_PATH = "vtop.tcss"
    TITLE = "vtop fleet"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("e", "all_alerts", "Alerts"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self, config: Config, *, fleet: Fleet | None = None, clock: Clock | None = None,
                 autorefresh: bool = True) -> None:
        super().__init__()
        self.config = config
        if config.theme:
            self.theme = config.theme
        self.fleet = fleet or Fleet(config, client_from_config(config), clock=clock, freeze_gc=True)
        self.autorefresh = autorefresh
        self._busy = False
        self._shown = -1
        self._status_text = ""

    def compose(self) -> ComposeResult:
        yield Static(f" vtop fleet · Prometheus {self.fleet.client.base} · connecting…", id="status")
        yield AlertsPanel(id="alerts")
        yield Input(placeholder="filter: instance, model, job, state or alert (Enter keeps, Esc clears)",
                    id="fleet-filter")
        yield FleetTable(id="fleet-table")
        yield Static(BOX_LINE, id="fleet-box")
        yield KeysBar(id="keys")

    async def on_mount(self) -> None:
        self.table.focus()
        if self.autorefresh:
            self.set_interval(self.fleet.refresh_s, self.tick_refresh)
            self.set_interval(1.0, self.update_status)
            self.run_worker(self.first(), exclusive=False, group="refresh")

    @property
    def table(self) -> FleetTable:
        return self.query_one("#fleet-table", FleetTable)

    async def first(self) -> None:
        """A refresh (the rows, painted at once), then the history the first time Prometheus answers."""
        self._busy = True
        try:
            await self.fleet.refresh()
            self.paint()
            if self.fleet.error is None and not self.fleet.backfilled:
                await self.fleet.backfill()
                self.paint()
        finally:
            self._busy = False

    def tick_refresh(self) -> None:
        if self._busy:
            return  # the last refresh still waits on its deadline: never two at once
        self.run_worker(self.refresh_once(), exclusive=False, group="refresh")

    async def refresh_once(self) -> None:
        if self._busy:
            return
        await self.first()
        if isinstance(self.screen, FleetDrill):
            await self.screen.reload()

    # ------------------------------------------------------------------ painting

    def paint(self) -> None:
        f = self.fleet
        if f.version != self._shown:
            self._shown = f.version
            self.table.set_rows(list(f.rows.values()))
            panel = self.query_one("#alerts", AlertsPanel)
            panel.set_level(TITLES if self.size.height < 40 or len(f.alerts) > 3 else FOCUS)
            mh = max(3, self.size.height // 3)
            if panel.styles.max_height is None or panel.styles.max_height.value != mh:
                panel.styles.max_height = mh  # a style set again lays the whole screen out again
            panel.show_alerts(f.alerts)
        self.update_status()

    def update_status(self) -> None:
        f = self.fleet
        n = len(f.rows)
        down = sum(1 for r in f.rows.values() if r.state == "down")
        stale = sum(1 for r in f.rows.values() if r.state == "stale")
        bits = [f" vtop fleet · {f.client.base} · {n} instance{'s' if n != 1 else ''}"]
        if down:
            bits.append(f"{down} DOWN")
        if stale:
            bits.append(f"{stale} STALE")
        if f.last_queries:
            bits.append(f"{f.last_queries} queries / {f.refresh_s:g} s (TTFT, GPUs every {f.slow_every_s:g} s)")
        if f.last_ok_wall is not None:
            age = max(0.0, f.clock.base.time() - f.last_ok_wall)
            # said once it is late (two refreshes missed): a count that ticks every second while all
            # is well redrew the screen every second for nothing (half the screen's CPU between refreshes)
            if age > 2 * f.refresh_s:
                bits.append(f"data {dur(age)} old")
        if not f.backfilled and f.refreshes:
            bits.append("reading history…")
        status = self.query_one("#status", Static)
        if f.error:
            since = f" for {dur(f.clock.base.monotonic() - f.error_since)}" if f.error_since is not None else ""
            bits.append(f"PROMETHEUS FAILING{since}: {f.error}")
            status.set_class(True, "-error")
        else:
            status.set_class(False, "-error")
            if f.partial:
                bits.append("partly: " + f.partial[0])
        text = " · ".join(bits)
        if text != self._status_text:
            # one line high (vtop.tcss): no layout of the screen for it, which every second was most of
            # the fleet screen's CPU between refreshes
            self._status_text = text
            status.update(text, layout=False)

    # ------------------------------------------------------------------ keys

    def on_fleet_table_open(self, msg: FleetTable.Open) -> None:
        self.push_screen(FleetDrill(self.fleet, msg.key))

    def action_all_alerts(self) -> None:
        if isinstance(self.screen, FleetDrill):
            key = self.screen.key
            self.push_screen(AlertsScreen(lambda: list(self.fleet.rows[key].alerts)))
        else:
            self.push_screen(AlertsScreen(lambda: self.fleet.alerts))

    def action_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.value = ""
        box.display = False
        self.table.set_filter("")
        self.table.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "fleet-filter":
            self.table.set_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "fleet-filter":
            if not event.value:
                event.input.display = False
            self.table.focus()

    async def on_unmount(self) -> None:
        await self.fleet.aclose()

    def fleet_rows_text(self) -> list[str]:  # tests
        return self.table.row_texts()


__all__ = ["BOX_LINE", "FleetApp"]
