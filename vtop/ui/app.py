"""The Textual application: layout, keys, and painting what the monitor knows.

Everything between the sources and the widgets lives in a
:class:`~vtop.monitor.Monitor` (the same one ``--once``, ``doctor`` and the
replay drive); this module only lays out the panels, paints what the monitor
says changed, once a tick, and runs the keys. Live, a
:class:`~vtop.monitor.live.LiveFeed` polls the sources into the monitor; a
replay's :class:`~vtop.monitor.player.Player` plays a recording into it; tests
drive it by hand (``autopoll=False``) with :meth:`VtopApp.poll_gpu_once`,
:meth:`VtopApp.poll_log_once`, :meth:`VtopApp.poll_server_once`.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import TYPE_CHECKING, Any, Literal

from textual import work
from textual.app import App, ComposeResult
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
from vtop.ui.widgets.alerts_panel import AlertsPanel, RequestsLine
from vtop.ui.widgets.gpu_panel import GpuPanel
from vtop.ui.widgets.keys_bar import KeysBar
from vtop.ui.widgets.log_pane import LogPane
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
SERVER_PANEL_MIN_ROWS = 6


class VtopApp(App[int]):
    CSS_PATH = "vtop.tcss"
    TITLE = "vtop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("c", "toggle_compact", "Cards"),
        Binding("p", "toggle_phases", "Phases"),
        Binding("l", "toggle_log", "Log"),
        Binding("w", "toggle_warnings", "Warn"),
        Binding("s", "snapshot", "Snap"),
        Binding("d", "pyspy", "py-spy"),
        Binding("t", "test_request", "Test"),
        Binding("r", "requests", "Requests"),
        Binding("e", "alert_details", "Alerts", show=False),
        Binding("question_mark", "readonly_info", "READ-ONLY: s d t off"),
    ]
    ACTION_KEYS = ("snapshot", "pyspy", "test_request")

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
        self.cards: dict[str, ServerCard] = {}
        """The server cards, by URL."""
        self._card_versions: dict[str, int] = {}
        self._widgets: dict[str, Any] = {}
        self._snapshots: Any = None
        self._snapshot_busy = False
        self._snap_pct = -5
        self._snap_text = ""
        self._action_client: Any = None
        self.last_snapshot: Any = None
        self.gpu_hung = False
        self._status_text = ""
        self._ticks = 0

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

    @property
    def snapshots(self) -> Any:
        """The snapshot runner (``s``), made when first used."""
        if self._snapshots is None:
            from vtop.actions.snapshot import SnapshotRunner

            self._snapshots = SnapshotRunner()
        return self._snapshots

    @property
    def action_client(self) -> Any:
        """An ``httpx.AsyncClient`` for the test request (streaming POST, JSON):
        made, and httpx imported, the first time a key needs it."""
        if self._action_client is None:
            import httpx

            # Never let environment proxies reroute a request to a local server.
            self._action_client = httpx.AsyncClient(trust_env=False, follow_redirects=False)
        return self._action_client

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
            yield StartupPanel(gpu_activity=self.monitor.gpu_activity, id="startup")
        yield LogPane(id="log")
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
        self._widget("alerts", AlertsPanel)
        self._widget("requests", RequestsLine).display = False
        self._widget("status", "#status")
        if self.replay is not None:
            if not self.replay.has_gpu:
                self.monitor.apply_gpu(GpuPoll(t=0.0, mono=0.0, status=OFF, message="no GPU samples in this recording"))
        elif self.gpu_source is None:
            self.monitor.apply_gpu(GpuPoll(t=0.0, mono=0.0, status=OFF, message="GPU panel off (--no-gpu)."))
        # No log watched: the pane would only take room from the charts.
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
        self.set_interval(self.config.interval, self._tick, name="paint")

    def on_resize(self) -> None:
        self._size_panels()

    def _size_panels(self) -> None:
        panel = self.w_gpu
        panel.max_gap = max(2.5 * self.config.interval, self.config.interval + 1.0)
        panel.max_height = max(1, self.size.height - 2 - SERVER_PANEL_MIN_ROWS)
        panel.relayout()

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
        self.round()
        self._watchdog()
        self._ticks += 1
        if self._ticks == self.SETTLE_GC_AFTER_TICKS and not self.is_headless:
            # Not under a test's Pilot (headless): freezing a test process's objects is not ours to do.
            from vtop.gc_tuning import settle_gc

            settle_gc()

    def _watchdog(self) -> None:
        hung = self.feed is not None and self.feed.gpu_hung_for() is not None
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
        changes = self.monitor.take_changes()
        m = self.monitor
        with self.batch_update():
            if GPU in changes:
                panel = self.w_gpu
                if panel.has_class("-stale") and not self.gpu_hung:
                    panel.remove_class("-stale")
                poll = self.gpu_history.last_poll
                panel.update_view(poll.mono if poll else 0.0)
            if LOG_SOURCE in changes:
                self.w_startup.set_message(m.log_message)
                if m.log_watch is not None:
                    self.w_log.display = True
            if LOG in changes and m.log_view is not None:
                self.w_startup.show(m.log_view)
                self.w_log.show(m.log_view)
                self._widget("requests", RequestsLine).show_requests(m.log_view)
            if SERVERS in changes:
                self._paint_servers()
            if ALERTS in changes:
                self._widget("alerts", AlertsPanel).show_alerts(m.alerts)
            self.update_status()

    def _paint_servers(self) -> None:
        now = self.monitor.clock.monotonic()
        for url, ws in self.monitor.servers.items():
            card = self.cards.get(url)
            if card is None:
                card = self._mount_card(ws)
            if self._card_versions.get(url) == ws.version:
                continue
            self._card_versions[url] = ws.version
            p = ws.process
            card.max_num_seqs = p.max_num_seqs if p is not None else card.max_num_seqs
            if p is not None:
                card.extra_title = f"pid {p.pid}" + (f" TP={p.tp}" if p.tp > 1 else "")
            if ws.last_view is not None:
                card.show(ws.last_view, now)

    def _mount_card(self, ws: WatchedServer) -> ServerCard:
        interval = self.config.interval
        card = ServerCard(ws.url, window_s=self.config.history, max_gap=max(2.5 * interval, interval + 1.0),
                          classes="server-card")
        self.cards[ws.url] = card
        box = self.query_one("#servers", Vertical)
        box.mount(card, before=self.query_one("#requests-line"))
        self.query_one("#servers-msg", Static).display = False
        return card

    # ------------------------------------------------------------------ status
    def gpu_status_text(self) -> str:
        poll = self.gpu_history.last_poll
        hung_for = self.feed.gpu_hung_for() if self.feed is not None else None
        if self.gpu_hung and hung_for is not None:
            return f"NVML not answering for {hung_for:.0f} s (GPU readings are stale)"
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

    def server_status_text(self) -> str:
        views = list(self.monitor.views().values())
        if not views:
            return "vLLM: looking…"
        if len(views) == 1:
            return f"vLLM: {views[0].state}"
        counts: dict[str, int] = {}
        for v in views:
            counts[v.state] = counts.get(v.state, 0) + 1
        return "vLLM: " + ", ".join(f"{n} {st}" for st, n in counts.items())

    def update_status(self) -> None:
        if self.replay is not None:
            text = f" {self.replay.status_text()} │ {self.gpu_status_text()} │ {self.server_status_text()}"
        else:
            rec = self.recorder
            rec_text = "" if rec is None else (f" │ {rec.stopped_reason}" if rec.stopped_reason else " │ ● REC")
            text = (f" vtop {__version__} │ {self.hostname} │ {self.gpu_status_text()} │ {self.server_status_text()}"
                    f" │ every {self.config.interval:g} s" + rec_text + (" │ READ-ONLY" if self.config.readonly else "")
                    + (f" │ {self._snap_text}" if self._snap_text else ""))
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

    # ------------------------------------------------------------ action keys
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """--readonly: the action keys show dimmed in the footer and do nothing.
        A replay hides them: they would act on this box, not the recorded one."""
        if action in self.ACTION_KEYS and self.replay is not None:
            return False
        if action in self.ACTION_KEYS and self.config.readonly:
            return None
        if action == "readonly_info":
            return True if self.config.readonly else False  # shown in the footer only when read-only
        return True

    def action_readonly_info(self) -> None:
        self.notify("read-only (--readonly): the snapshot, py-spy and test-request keys are off")

    def latest_snapshot_folder(self) -> Any:
        from vtop.actions.snapshot import latest_bundle

        return self.snapshots.last_path or latest_bundle(self.config.snapshot_dir)

    def action_snapshot(self) -> None:
        if self.snapshots.running or self._snapshot_busy:
            self.notify("a snapshot is already being written; wait for it to finish", severity="warning")
            return
        self.notify(f"snapshot: writing an incident bundle under {self.config.snapshot_dir} …")
        self._snapshot_busy = True
        self._snapshot_worker()

    @work(exclusive=True, group="snapshot", exit_on_error=False)
    async def _snapshot_worker(self) -> None:
        try:
            await self._write_snapshot()
        finally:
            self._snapshot_busy = False
            self._snap_pct = -5
            self._snap_text = ""
            self.update_status()

    async def _write_snapshot(self) -> None:
        from vtop.core.phases import summarize
        from vtop.sources.logtail import LogTailer
        from vtop.sources.vllm import MAX_BODY_BYTES

        metrics: dict[str, bytes | None] = {}
        for url in self.monitor.servers:
            try:
                assert self.feed is not None  # the action keys are off in a replay
                _, body = await asyncio.wait_for(
                    self.feed.client.get(url + "/metrics", headers=[("Accept-Encoding", "identity")],
                                            limit=MAX_BODY_BYTES), 3.0)
                metrics[url] = body
            except Exception:  # the bundle says the server gave nothing
                metrics[url] = None
        src = getattr(self.log_watch, "source", None)
        log_path = src.path if isinstance(src, LogTailer) else None
        phases = dict(summarize(self.log_view.snapshot)) if self.log_view else None
        secrets = [k for k in (self.config.api_key, os.environ.get("VLLM_API_KEY")) if k]
        fut = self.snapshots.start(
            self.config.snapshot_dir,
            log_path=log_path,
            servers=[ws.process for ws in self.monitor.servers.values() if ws.process is not None],
            metrics_texts=metrics,
            history_json=self.monitor.history_json(),
            phases_json=phases,
            alerts=[a.to_json() for a in self.alerts],
            screen_svg=self.export_screenshot(),
            redact_prompts=self.config.redact_prompts,
            secrets=secrets,
            progress=self._snapshot_progress_from_thread,
        )
        res = await asyncio.wrap_future(fut)
        self.last_snapshot = res
        sev: Literal["information", "warning", "error"] = (
            "information" if res.ok else ("warning" if res.refused or res.path else "error"))
        self.notify(res.message, severity=sev, timeout=10)

    def _snapshot_progress_from_thread(self, done: int, total: int) -> None:
        """Called from the bundle's thread while it copies the log."""
        pct = int(100 * done / total) if total else 100
        if pct // 5 != self._snap_pct // 5:
            self._snap_pct = pct
            try:
                self.call_from_thread(self._show_snapshot_progress, pct)
            except RuntimeError:  # the app is gone
                pass

    def _show_snapshot_progress(self, pct: int) -> None:
        self._snap_text = f"snapshot: copying the log {pct}%" if pct < 100 else ""
        self.update_status()

    def action_pyspy(self) -> None:
        from vtop.actions.pyspy import pick_targets
        from vtop.ui.screens import PySpyScreen

        e = self.monitor.action_server()
        if e is None or e.process is None:
            self.notify("py-spy: no vLLM process found on this box to dump (a remote URL cannot be dumped)",
                        severity="warning")
            return
        targets = pick_targets(e.process)
        if not targets:
            self.notify(f"py-spy: no process to dump under pid {e.process.pid}", severity="warning")
            return
        self.push_screen(PySpyScreen(targets[0], server=e.process, snapshot_folder=self.latest_snapshot_folder))

    def action_test_request(self) -> None:
        from vtop.ui.screens import ProbeScreen

        e = self.monitor.action_server()
        if e is None:
            self.notify("test request: no vLLM server watched", severity="warning")
            return
        v = e.last_view
        models = [v.model_id] if v is not None and v.model_id else ([e.process.served_name] if e.process and e.process.served_name else [])
        self.push_screen(ProbeScreen(e.url, models=models, max_model_len=v.max_model_len if v else None,
                                     client=self.action_client, api_key=self.monitor.api_key_for(e.url)))

    # ----------------------------------------------------------------- actions
    def action_requests(self) -> None:
        from vtop.ui.screens import RequestsScreen

        self.push_screen(RequestsScreen(lambda: self.log_view))

    def action_alert_details(self) -> None:
        self._widget("alerts", AlertsPanel).toggle_expanded()

    def action_toggle_compact(self) -> None:
        self.w_gpu.toggle_compact()

    def action_toggle_phases(self) -> None:
        self.w_startup.toggle()

    def action_toggle_log(self) -> None:
        pane = self.w_log
        pane.display = not pane.display

    def action_toggle_warnings(self) -> None:
        pane = self.w_log
        pane.display = True
        pane.toggle_filter()

    async def action_quit(self) -> None:
        if self.feed is not None:
            await self.feed.aclose()
        if self._action_client is not None:
            await self._action_client.aclose()
        self.exit(0)

    def on_unmount(self) -> None:
        if self.feed is not None:
            self.feed.stop()
        if self.recorder is not None:
            self.recorder.close()
