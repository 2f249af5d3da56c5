"""The Textual application: layout, keys, and painting what the monitor knows.

Everything between the sources and the widgets lives in a
:class:`~vtop.monitor.Monitor` (the same one ``--once``, ``doctor`` and the
replay drive); this module only lays out the panels, paints what the monitor
says changed, once a tick, and runs the keys. Live, a
:class:`~vtop.monitor.live.LiveFeed` polls the sources into the monitor; a
replay's :class:`~vtop.monitor.player.Player` plays a recording into it; tests
drive it by hand (``autopoll=False``) with :meth:`VtopApp.poll_gpu_once`,
:meth:`VtopApp.poll_log_once`, :meth:`VtopApp.poll_server_once`.

The keys are in two mixins: :class:`~vtop.ui.view_keys.ViewKeys` (what the screen shows: help,
freeze, the poll interval, the log's filters, the panels' toggles, the full-screen views) and
:class:`~vtop.ui.action_keys.ActionKeys` (the keys that act on the box: snapshot, py-spy, test
request, and which keys are on).
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from vtop import __version__
from vtop.clock import Clock, SystemClock
from vtop.config import Config
from vtop.core.gpu_history import GpuHistory
from vtop.model.gpu import ABSENT, OFF, GpuPoll, GpuSample
from vtop.monitor import ALERTS, GPU, LOG, LOG_SOURCE, SERVERS, Monitor, WatchedServer
from vtop.monitor.live import GpuSourceLike, LiveFeed
from vtop.monitor.monitor import make_log_watch, make_recorder
from vtop.sources.nvml import make_gpu_source
from vtop.ui.action_keys import ActionKeys
from vtop.ui.view_keys import ViewKeys
from vtop.ui.widgets.alerts_panel import AlertsPanel, RequestsLine
from vtop.ui.widgets.gpu_panel import GpuPanel
from vtop.ui.widgets.keys_bar import KeysBar
from vtop.ui.widgets.log_pane import LogFilter, LogPane
from vtop.ui.widgets.server_panel import ServerCard
from vtop.ui.widgets.startup_panel import StartupPanel

if TYPE_CHECKING:
    from vtop.core.rules import Alert, Diagnoser
    from vtop.monitor.logwatch import LogView, LogWatch
    from vtop.monitor.player import Player

# Modules the first frame does not need (the log parser with its ~60 regular
# expressions, the diagnosis rules, the recorder, the snapshot code) are
# imported where they are first used: each costs 10-60 ms at start-up.

GIB = 2**30


class VtopApp(ActionKeys, ViewKeys):
    CSS_PATH = "vtop.tcss"
    TITLE = "vtop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        Binding("e", "alert_details", "Alerts"),
        Binding("space", "freeze", "Freeze"),
        Binding("plus,equals_sign", "poll_interval(-1)", "Faster", key_display="+"),
        Binding("minus", "poll_interval(1)", "Slower", key_display="-"),
        Binding("c", "toggle_compact", "Cards"),
        Binding("i", "toggle_detail", "Detail", show=False),
        Binding("p", "toggle_phases", "Phases"),
        Binding("l", "toggle_log", "Log"),
        Binding("w", "toggle_warnings", "Warn"),
        Binding("a", "toggle_probes", "Polls", show=False),
        Binding("slash", "filter_log", "Filter", key_display="/"),
        Binding("r", "requests", "Requests"),
        Binding("h", "timeline", "Before"),
        Binding("P", "processes", "Procs", key_display="P"),
        Binding("s", "snapshot", "Snap"),
        Binding("d", "pyspy", "py-spy"),
        Binding("t", "test_request", "Test"),
        Binding("x", "stop_request", "Stop"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(
        self,
        config: Config,
        *,
        gpu_source: GpuSourceLike | None | str = "auto",
        autopoll: bool = True,
        hang_after_s: float | None = None,
        hostname: str | None = None,
        log_watch: LogWatch | None | str = "auto",
        log_fd: int | None = None,
        replay: Player | None = None,
        discover: Any = "auto",
        clock: Clock | None = None,
    ) -> None:
        super().__init__()
        #: a :class:`~vtop.monitor.player.Player` when playing a recording
        self.replay = replay
        self.hostname = hostname or socket.gethostname()
        self.config = config
        if config.theme:
            self.theme = config.theme
        self.autopoll = autopoll and replay is None
        if replay is not None:
            self.monitor = replay.monitor
            self.feed: LiveFeed | None = None
        else:
            clock = clock or SystemClock()
            recorder = make_recorder(config)
            lw = make_log_watch(config, clock=clock, log_fd=log_fd) if isinstance(log_watch, str) else log_watch
            self.monitor = Monitor(config, clock=clock, recorder=recorder, log_watch=lw)
            src = make_gpu_source(config) if isinstance(gpu_source, str) else gpu_source
            kw: dict[str, Any] = {} if discover == "auto" else {"discover": discover}
            self.feed = LiveFeed(self.monitor, gpu_source=src, hang_after_s=hang_after_s, **kw)
        #: ``--on-alert`` / ``--webhook``: each start, severity change and clear sent off the tick (never in a replay)
        self.delivery: Any = None
        if replay is None and config.alert_delivery and (config.on_alert or config.webhook):
            from vtop.actions.alerts_out import delivery_for

            self.delivery = delivery_for(config)
        self.cards: dict[str, ServerCard] = {}
        """The server cards, by URL."""
        self._card_versions: dict[str, tuple[int, float]] = {}
        self._past_offered = False
        self._widgets: dict[str, Any] = {}
        self._snapshots: Any = None
        self._snapshot_busy = False
        self._snap_pct = -5
        self._snap_text = ""
        self._action_client: Any = None
        self._stops: list[Any] = []
        """The stops (``x``) not yet written into a bundle (:class:`vtop.actions.stop.StopRecord`)."""
        self.last_snapshot: Any = None
        self.gpu_hung = False
        self._status_text = ""
        self._ticks = 0
        self.frozen = False
        """space: the screen stops changing; polling, the histories and the alerts go on."""
        self._paint_timer: Any = None
        self._note = ""
        self._note_timer: Any = None
        self.log_wanted = True
        """The log pane is wanted (``l`` toggles): it gets the rows the panels leave."""
        self.log_forced = False
        """``l`` pressed while an alert had taken the log's rows: give it some anyway."""
        self._fit_gpus = -1
        self._plan: dict[str, int] = {}
        """Rows per part from the last layout plan (tests read it)."""

    # ------------------------------------------------------- what the monitor knows
    @property
    def gpu_history(self) -> GpuHistory:
        return self.monitor.gpu_history

    @property
    def log_watch(self) -> LogWatch | None:
        return self.monitor.log_watch

    @property
    def log_view(self) -> LogView | None:
        return self.monitor.log_view

    @property
    def alerts(self) -> list[Alert]:
        return self.monitor.alerts

    @property
    def recorder(self) -> Any:
        return self.monitor.recorder

    @property
    def diagnoser(self) -> Diagnoser:
        return self.monitor.diagnoser

    @property
    def gpu_source(self) -> GpuSourceLike | None:
        return self.feed.gpu_source if self.feed is not None else None

    #: (theme name, Theme) of the last ``current_theme`` answer
    _theme_hit: tuple[str, Any] | None = None

    @property
    def current_theme(self) -> Any:
        """Textual's answer, kept until the theme or the registered themes change.

        Textual asks this for every widget and every line it renders (the ANSI
        theme of each line's post-processing), and each time it copies the dict of
        every registered theme twice: 2.2 % of vtop's CPU with 8 GPUs and 2 servers
        (py-spy on the dev VM)."""
        name = self.theme
        hit = self._theme_hit
        if hit is not None and hit[0] == name:
            return hit[1]
        theme = super().current_theme
        self._theme_hit = (name, theme)
        return theme

    def register_theme(self, theme: Any) -> None:
        super().register_theme(theme)
        self._theme_hit = None

    def unregister_theme(self, theme_name: str) -> None:
        super().unregister_theme(theme_name)
        self._theme_hit = None

    def get_driver_class(self) -> Any:
        """Textual's own driver, except on Linux with a Textual release vtop knows: the
        same with a key thread that sleeps while nobody types (:mod:`vtop.ui.driver`).
        ``TEXTUAL_DRIVER`` still wins."""
        if os.environ.get("TEXTUAL_DRIVER"):
            return super().get_driver_class()
        from vtop.ui.driver import calm_driver_class

        return calm_driver_class() or super().get_driver_class()

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        yield AlertsPanel(id="alerts")
        with VerticalScroll(id="body"):
            yield GpuPanel(self.gpu_history, procs_line=self.procs_line, id="gpus")
            with Vertical(id="servers"):
                yield Static("vLLM: looking for servers on this box…", id="servers-msg")
                yield RequestsLine(id="requests-line")
            yield StartupPanel(gpu_activity=self.monitor.gpu_activity, download=self.monitor.download_progress,
                               usual=self.monitor.start_usual, budget=self.monitor.memory_budget,
                               oom=self.monitor.oom_finding, id="startup")
        yield LogPane(id="log")
        yield LogFilter(placeholder="filter the log: type a text (Enter keeps it, Esc clears it)", id="log-filter")
        yield KeysBar(id="keys")

    @property
    def w_gpu(self) -> GpuPanel:
        return self._widget("gpu", GpuPanel)

    @property
    def w_startup(self) -> StartupPanel:
        return self._widget("startup", StartupPanel)

    @property
    def w_log(self) -> LogPane:
        return self._widget("log", LogPane)

    def _widget(self, key: str, cls: Any) -> Any:
        """Panels are looked up once and kept: a tick that fires while the app shuts
        down (or under a modal screen) must not fail on a DOM query, and a query per
        tick is work for nothing."""
        w = self._widgets.get(key)
        if w is None:
            w = self._widgets[key] = self.query_one(cls)
        return w

    def on_mount(self) -> None:
        self._widget("alerts", AlertsPanel).stop_key = not self.config.readonly and self.replay is None
        self._widget("requests", RequestsLine).display = False
        self._widget("log", LogPane)
        self._widget("status", "#status")
        # looked up here, on the main screen: a tick under a modal screen (help, a test request)
        # must find them too, and the app's own query_one asks the screen on top
        for key in ("servers-msg", "body", "servers", "requests-line", "log-filter"):
            self._widget(key, "#" + key)
        if self.replay is not None:
            if not self.replay.has_gpu:
                self.monitor.apply_gpu(GpuPoll(t=0.0, mono=0.0, status=OFF, message="no GPU samples in this recording"))
        elif self.gpu_source is None:
            self.monitor.apply_gpu(GpuPoll(t=0.0, mono=0.0, status=OFF, message="GPU panel off (--no-gpu)."))
        # No log watched: the pane would only take room from the charts (the layout plan).
        self.w_log.display = self.log_watch is not None
        self.w_log.redact_prompts = self.config.redact_prompts
        self.w_startup.redraw()
        self._size_panels()
        self.monitor.add_cli_urls()
        self.paint()
        if self.autopoll:
            # After the first frame: the poll threads' start (NVML init, the first
            # /proc scan) competes for the GIL with drawing it.
            self.call_after_refresh(self._start_polling)
        elif self.replay is not None:
            from vtop.monitor.player import TICK_S

            player = self.replay
            player.on_moved = self.paint
            player.advance(0.0)
            timer = self.set_interval(TICK_S, player.on_timer, name="replay")
            player.on_paused = lambda paused: timer.pause() if paused else timer.resume()
            if player.paused or player.ended:
                timer.pause()

    def _start_polling(self) -> None:
        assert self.feed is not None
        self.feed.start()
        self._paint_timer = self.set_interval(self.config.interval, self._tick, name="paint")

    def on_resize(self) -> None:
        self._size_panels()
        self.update_status()  # the status line's detail follows the width
        # once more after the screen has its new size (the event can come before it does)
        self.call_after_refresh(self._fit)

    def _size_panels(self) -> None:
        panel = self.w_gpu
        panel.max_gap = max(2.5 * self.config.interval, self.config.interval + 1.0)
        self._fit()

    def _fit(self) -> None:
        """Share the rows between the panels (:mod:`vtop.ui.layout`): when an alert is on,
        its fix and the server's queues come before the log pane; cards fold to one line
        each before they go."""
        from vtop.ui.layout import LOG_MIN_ROWS, Part, plan
        from vtop.ui.widgets.alerts_panel import FOCUS, FULL, TITLES, is_incident
        from vtop.ui.widgets.gpu_panel import CARD_HEIGHT, layout_for
        from vtop.ui.widgets.server_panel import FULL_CARD, ONE_LINE, QUEUES

        width, height = self.size
        if width <= 0 or height <= 0:
            return
        total = max(0, height - 2)  # the status line and the keys
        if self._widget("log-filter", "#log-filter").display:
            total -= 1
        inner = max(10, width - 4)  # border and padding
        console = self.console
        parts: list[Part] = []
        alerts = self.monitor.alerts
        ap = self._widget("alerts", AlertsPanel)
        if alerts:
            parts.append(Part("alerts", (0,) + tuple(ap.rows(alerts, lv, inner) + 2 for lv in (TITLES, FOCUS, FULL))))
        gpu = self.w_gpu
        msg = gpu.message_text()
        msg_rows = len(Text(msg).wrap(console, max(10, width - 2))) if msg else 0
        n = len(self.gpu_history.tracks)
        if n:
            cols = layout_for(n, width, 10**6)[1]
            full = msg_rows + (n if gpu.compact_forced else -(-n // cols) * CARD_HEIGHT)
            parts.append(Part("gpu", (0, msg_rows + n, max(msg_rows + n, full))))
        elif msg_rows:
            parts.append(Part("gpu", (0, msg_rows)))
        cards = list(self.cards.items())
        for url, card in cards:
            parts.append(Part("srv:" + url, card.level_heights(inner)))
        req = self._widget("requests", RequestsLine)
        if req.has_text:
            parts.append(Part("requests", (0, 1)))
        if not cards:
            parts.append(Part("servers-msg", (0, 1)))
        startup = self.w_startup
        story = startup.is_story()  # a start in progress, failed or stalled
        whole = startup.rows(inner) + 2
        # a start in progress on a small screen: its short form (the current phase, the budget) before nothing
        short = min(whole, startup.rows(inner, compact=True) + 2) if story else whole
        parts.append(Part("startup", (0, short, whole) if short < whole else (0, whole)))
        log_wanted = self.log_watch is not None and self.log_wanted
        incident = is_incident(alerts)
        srv = ["srv:" + url for url, _ in cards]
        if incident:
            order = ([("alerts", TITLES), ("gpu", 1)] + [(k, ONE_LINE) for k in srv] + [("servers-msg", 1)]
                     + [(k, QUEUES) for k in srv] + [("alerts", FOCUS)]
                     + ([("log", 1)] if self.log_forced else [])
                     + [("requests", 1)] + [("startup", 1), ("startup", 2)] * story + [(k, FULL_CARD) for k in srv]
                     + [("alerts", FULL), ("gpu", 2), ("startup", 1), ("startup", 2), ("log", 1)])
        else:
            order = ([("gpu", 1)] + [(k, ONE_LINE) for k in srv] + [("servers-msg", 1)]
                     + [("startup", 1), ("startup", 2)] * story
                     + [(k, QUEUES) for k in srv] + [("alerts", TITLES), ("requests", 1), ("alerts", FOCUS),
                                                      ("log", 1), ("gpu", 2)]
                     + [(k, FULL_CARD) for k in srv] + [("startup", 1), ("startup", 2), ("alerts", FULL)])
        if log_wanted:
            parts.append(Part("log", (0, min(LOG_MIN_ROWS, total))))
        level = plan(total, parts, order)
        h = {p.name: p.levels[level[p.name]] for p in parts}
        with self.batch_update():
            ap.set_level(max(TITLES, level.get("alerts", FULL)))
            ap.show_alerts(alerts)  # drawn anew only if the width changed (a resize)
            # Textual refreshes the whole layout on every set of None, changed or not (its ScalarProperty,
            # textual 8.2): set to None each tick, this reflowed the screen every second.
            cap = h.get("alerts", 0) or None
            if cap != (None if ap.styles.max_height is None else ap.styles.max_height.value):
                ap.styles.max_height = cap
            if "gpu" in level:
                gpu.display = h["gpu"] > 0
                gpu.max_height = max(1, h["gpu"] - msg_rows)
                gpu.relayout()
            for url, card in cards:
                card.set_level(level["srv:" + url])
            req.display = req.has_text and level.get("requests", 0) > 0
            self._widget("servers-msg", "#servers-msg").display = not cards and level.get("servers-msg", 0) > 0
            startup.display = level["startup"] > 0
            startup.set_compact(short < whole and level["startup"] == 1)
            body_rows = sum(v for k, v in h.items() if k not in ("alerts", "log"))
            log = self.w_log
            log.display = log_wanted and level.get("log", 0) > 0
            body = self._widget("body", "#body")
            if log.display:
                rest = total - h.get("alerts", 0) - body_rows
                body.styles.height = body_rows
                rows = max(LOG_MIN_ROWS, rest)
                if log.styles.height is None or log.styles.height.value != rows:
                    log.styles.height = rows
                    # the newest line at the bottom once the pane has its new height
                    log.call_after_refresh(log.scroll_end, animate=False, immediate=True)
            else:
                body.styles.height = "1fr"
        self._plan = h

    # --------------------------------------------------------- driven by hand
    async def poll_gpu_once(self) -> GpuPoll | None:
        """Tests: one NVML poll through a real thread, applied and painted."""
        if self.feed is None:
            return None
        poll = await self.feed.poll_gpu_once()
        self.round()
        return poll

    async def poll_log_once(self) -> LogView | None:
        """Tests: one log poll through a real thread, applied and painted."""
        lw = self.log_watch
        if lw is None:
            return None
        view = await asyncio.to_thread(lw.poll)
        self.monitor.apply_log(view)
        self.round()
        return view

    async def poll_server_once(self, url: str) -> Any:
        """Tests: one scrape of ``url``, applied and painted."""
        assert self.feed is not None
        self.monitor.add_server(url, from_cli=True)
        view = await self.feed.poll_server_once(url)
        self.round()
        return view

    def apply_procs(self, servers: list[Any]) -> None:
        """Tests: a process scan's result, applied and painted."""
        self.monitor.apply_procs(servers)
        self.round()

    def apply_server(self, url: str, poll: Any) -> Any:
        """Tests: one poll of a server (a given one), applied and painted."""
        view = self.monitor.apply_server(url, poll)
        self.round()
        return view

    def apply_gpu(self, poll: GpuPoll, names: dict[int, str] | None = None) -> None:
        """Tests: one GPU poll (a given one), applied and painted."""
        self.monitor.apply_gpu(poll, names)
        self.round()

    def round(self) -> None:
        """Close a round of the monitor's and paint it."""
        self.monitor.tick()
        self.paint()

    # ------------------------------------------------------------------ ticks
    #: Paint ticks after which start-up counts as over (:func:`vtop.gc_tuning.settle_gc`):
    #: by the third, every source has answered once and its modules are imported.
    SETTLE_GC_AFTER_TICKS = 3

    def _tick(self) -> None:
        """Every interval: take what the sources brought, close the round, paint."""
        if self.feed is not None:
            self.feed.collect()
        self.round()  # frozen (space): the monitor's round still closes, the screen waits
        if self.delivery is not None:
            self._deliver()
        self._watchdog()
        self._ticks += 1
        if self._ticks == self.SETTLE_GC_AFTER_TICKS and not self.is_headless:
            # Not under a test's Pilot (headless): freezing a test process's objects is not ours to do.
            from vtop.gc_tuning import settle_gc

            settle_gc()

    def _deliver(self) -> None:
        """Hand this tick's changes of the incidents to the alert delivery (a queue: never waits) and show
        what it says went wrong, each failure once (:mod:`vtop.actions.alerts_out`)."""
        self.delivery.observe_monitor(self.monitor)
        for line in self.delivery.take_notices():
            self.notify(line, severity="error" if "failed" in line else "information", timeout=15)

    def _watchdog(self) -> None:
        # a call in flight past the hang bound, or readings past the monitor's stale bound (one for every face)
        hung = (self.feed is not None and self.feed.gpu_hung_for() is not None) or self.monitor.gpu_stale_for() is not None
        if hung or self.gpu_hung:
            self.gpu_hung = hung
            self.w_gpu.set_class(hung, "-stale")
            self.update_status()

    def paint(self) -> None:
        """Show what the monitor says changed since the last paint, in one batch.

        Sources deliver whenever their poll ends (NVML after 1 ms, a scrape after
        20 ms, the log in between); painting each as it came meant up to three
        full compositor passes a second. One paint per interval is one pass.
        """
        if self.frozen:
            return  # what changed waits in the monitor: space again paints it all at once
        changes = self.monitor.take_changes()
        m = self.monitor
        with self.batch_update():
            if GPU in changes:
                panel = self.w_gpu
                if panel.has_class("-stale") and not self.gpu_hung:
                    panel.remove_class("-stale")
                poll = self.gpu_history.last_poll
                panel.update_view(poll.mono if poll else 0.0)
            if LOG_SOURCE in changes or (SERVERS in changes and m.log_watch is None):
                # the log line, and (once, there) the other evidence vtop lacks and what would give it
                msg = "\n".join(x for x in (m.log_message, *m.missing_evidence()) if x) or None
                if msg != self.w_startup.message:
                    self.w_startup.set_message(msg)
            if LOG in changes and m.log_view is not None:
                self.w_startup.show(m.log_view)
                self.w_log.show(m.log_view)
            if changes & {LOG, SERVERS, ALERTS}:
                self._widget("requests", RequestsLine).show_requests(m.requests_of(), m.log_target_down())
            if SERVERS in changes or self.cards:
                self._paint_servers()
            if ALERTS in changes:
                self._widget("alerts", AlertsPanel).show_alerts(m.alerts)
            if changes & {ALERTS, SERVERS, LOG, LOG_SOURCE} or len(self.gpu_history.tracks) != self._fit_gpus:
                self._fit_gpus = len(self.gpu_history.tracks)
                self._fit()
            self.update_status()

    def chart_now(self) -> float:
        """The right edge of every chart: the GPU cards' (their last poll) while it is recent,
        so the server cards' sparklines end in the same column as the GPU ones; else now."""
        now = self.monitor.clock.monotonic()
        poll = self.gpu_history.last_poll
        if poll is not None and poll.gpus and 0.0 <= now - poll.mono <= self.w_gpu.max_gap:
            return poll.mono
        return now

    def _paint_servers(self) -> None:
        now = self.chart_now()
        self._late_note()
        for url, ws in self.monitor.servers.items():
            card = self.cards.get(url)
            if card is None:
                card = self._mount_card(ws)
            # a new poll, or time moved on: the charts and "down for" follow the clock
            # between polls too (a server that refuses is polled every 5 s)
            if self._card_versions.get(url) == (ws.version, now):
                continue
            self._card_versions[url] = (ws.version, now)
            p = ws.process
            card.max_num_seqs = p.max_num_seqs if p is not None else card.max_num_seqs
            # a process gone (a failed start, a stop) leaves no pid in the title: the body says none runs
            card.extra_title = "" if p is None else f"pid {p.pid}" + (f" TP={p.tp}" if p.tp > 1 else "")
            gpus = self.monitor.server_gpus(url) if p is not None else []
            if gpus:  # its GPUs and what it holds there: two servers on one GPU each say theirs
                held = [b for _, b in gpus]
                mem = "" if any(b is None for b in held) else f" {sum(b for b in held if b is not None) / GIB:.1f} GiB"
                card.extra_title += f" · gpu{','.join(str(i) for i, _ in gpus)}{mem}"
            if ws.last_view is not None:
                card.seen = self.monitor.last_seen(ws.last_view)
                card.backfill = self.monitor.backfill(url)
                if card.backfill is not None and card.since_wall is None:
                    card.since_wall = self.monitor.wall_of(card.backfill.until)
                card.show(ws.last_view, now)

    def _late_note(self) -> None:
        """While a server card shows charts from before vtop started (its log's), the GPU panel says
        plainly that its charts have no such past."""
        since = next((c.since_wall for c in self.cards.values() if c.backfill is not None and c.since_wall
                      and c.log_shown(c.content_width() or 80)), None)
        note = (f"GPU charts start at {since}, when vtop started: NVML keeps no history before that "
                "(the server charts before it are from the vLLM log)") if since else ""
        past = self.monitor.has_past()
        if past != self._past_offered:
            self._past_offered = past
            self.refresh_bindings()  # the timeline key shows (footer and help) once the log tells of the past
        if note != self.w_gpu.late_note:
            self.w_gpu.late_note = note
            poll = self.gpu_history.last_poll
            self.w_gpu.update_view(poll.mono if poll else 0.0)

    def _mount_card(self, ws: WatchedServer) -> ServerCard:
        interval = self.config.interval
        card = ServerCard(ws.url, window_s=self.config.history, max_gap=max(2.5 * interval, interval + 1.0),
                          classes="server-card")
        self.cards[ws.url] = card
        box = self._widget("servers", "#servers")
        box.mount(card, before=self._widget("requests-line", "#requests-line"))
        self._widget("servers-msg", "#servers-msg").display = False
        return card

    # ------------------------------------------------------------------ status
    def gpu_status_text(self, detail: int = 2) -> str:
        """The GPUs in the status line: ``detail`` 2 names the model and the driver (``1 × NVIDIA H200 ·
        driver 580.159.04``), 1 the model only, 0 the count only (``1 GPU``): a narrow terminal drops
        them, in that order, before any server's state (:meth:`update_status`)."""
        poll = self.gpu_history.last_poll
        if self.gpu_hung:
            age = self.monitor.gpu_readings_age()
            # an NVML call in flight past the hang bound, or none came (vtop itself starved of CPU)
            why = "NVML not answering" if self.feed is not None and self.feed.gpu_hung_for() is not None \
                else "no new GPU readings"
            return f"{why}: GPU readings " + (f"{age:.0f} s old" if age is not None else "missing") + " (stale)"
        if poll is None:
            return "GPU: starting NVML…"
        if poll.status == OFF:
            return "GPU: off"
        if poll.status == ABSENT:
            return "GPU: none"
        names = {g.name for g in poll.gpus}
        kind = names.pop() if len(names) == 1 else "mixed"
        n = len(poll.gpus)
        txt = f"{n} × {kind}" if detail >= 1 else f"{n} GPU{'s' if n != 1 else ''}"
        if self.config.simulate_gpus or (poll.driver and "simulated" in poll.driver):
            txt += " SIMULATED"  # --simulate-gpus: made-up readings, said where the GPUs are named
        elif poll.driver and detail >= 2:
            txt += f" · driver {poll.driver.split()[0]}"
        lost = sum(1 for g in poll.gpus if g.lost)
        if lost:
            txt += f" · {lost} LOST"
        return txt

    def status_text(self, width: int) -> str:
        """The status line for ``width`` columns: the servers' state always; to make room, the GPUs'
        driver version goes first, then their model name, then vtop's version (a replay's wall clock) and
        the poll interval (a replay's pause note).
        At 120 columns the servers' state was cut (``... · driver 580.159.04 │ vLLM:``), at 80 all of it."""
        servers = self.server_status_text()
        text = ""
        for detail, own, every in ((2, True, True), (1, True, True), (0, True, True), (0, False, True),
                                   (0, False, False)):
            gpu = self.gpu_status_text(detail)
            if self.replay is not None:  # its wall clock goes with vtop's own version, its pause note last
                text = f" {self.replay.status_text(stamp=own, note=every)} │ {gpu} │ {servers}"
            else:
                rec = self.recorder
                rec_text = "" if rec is None else (f" │ {rec.stopped_reason}" if rec.stopped_reason else " │ ● REC")
                text = ((f" vtop {__version__} │ " if own else " ") + f"{self.hostname} │ {gpu} │ {servers}"
                        + (f" │ every {self.config.interval:g} s" if every else "") + rec_text
                        + (" │ READ-ONLY" if self.config.readonly else "")
                        + (f" │ {self._snap_text}" if self._snap_text else ""))
            if len(text) + (len(" ❚❚ FROZEN (space: catch up) │") if self.frozen else 0) <= width:
                break
        return text

    def server_status_text(self) -> str:
        views = list(self.monitor.views().values())
        if not views:
            return "vLLM: looking…"
        def state(v: Any) -> str:  # a live server put to sleep (POST /sleep) says so
            return "sleeping" if v.sleep_level and v.state == "up" else v.state

        # the engines' own names (SGLang's servers are not vLLM's); both when the box runs both
        names = sorted({v.engine_name for v in views}, key=lambda n: (n != "vLLM", n))
        who = "/".join(names)
        if len(views) == 1:
            return f"{who}: {state(views[0])}"
        counts: dict[str, int] = {}
        for v in views:
            counts[state(v)] = counts.get(state(v), 0) + 1
        return f"{who}: " + ", ".join(f"{n} {st}" for st, n in counts.items())

    def update_status(self) -> None:
        text = self.status_text(self.size.width)
        if self.frozen:
            text = " ❚❚ FROZEN (space: catch up) │" + text
        if self._note:
            text += f" │ {self._note}"
        if text != self._status_text:
            self._status_text = text
            self._widget("status", "#status").update(text)

    def procs_line(self, g: GpuSample) -> str:
        if not g.procs:
            return "no compute process" if g.procs is not None else ""
        parts = []
        owner, names = self.monitor.gpu_owner, self.monitor.proc_names
        for p in sorted(g.procs, key=lambda p: -(p.used_bytes or 0))[:3]:
            name = owner.get(p.pid) or names.get(p.pid, "")
            mem = "" if p.used_bytes is None else f" {p.used_bytes / GIB:.1f} GiB"
            parts.append(f"{name} {p.pid}{mem}".strip())
        more = len(g.procs) - 3
        if more > 0:
            parts.append(f"+{more}")
        return " · ".join(parts)

    # ------------------------------------------------------------------ quit
    async def action_quit(self) -> None:
        if self.feed is not None:
            await self.feed.aclose()
        if self._action_client is not None:
            await self._action_client.aclose()
        self.exit(0)

    def on_unmount(self) -> None:
        if self.feed is not None:
            self.feed.stop()
        lw = self.monitor.log_watch
        if lw is not None and self.replay is None:
            # an exit without q (SIGTERM, the end of a test): a followed journal's `journalctl -f` child
            # would outlive vtop until its next line; a file is let go (closing twice is harmless)
            try:
                lw.close()
            except Exception:  # noqa: BLE001 - shutting down: what is left is the OS's to close
                pass
        if self.delivery is not None:
            self.delivery.close()
        self.monitor.finish_writes(1.0)
        if self.recorder is not None:
            self.recorder.close()
