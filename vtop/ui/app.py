"""The Textual application: layout, keys, and the routing of poll results.

Sources are injected (``gpu_source``) and polling can be switched off
(``autopoll=False``) so tests drive the app tick by tick with
:meth:`VtopApp.poll_gpu_once`; in production each source runs in its own
one-shot timer chain (:mod:`vtop.ui.polling`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Static

from vtop import __version__
from vtop.config import Config
from vtop.core.gpu_history import GpuHistory
from vtop.sources.gpu import ABSENT, OFF, GpuPoll, GpuSample
from vtop.sources.nvml import make_gpu_source
from vtop.sources.procs import ProcNames
from vtop.ui.polling import PollLoop
from vtop.ui.server_watch import ServerWatch
from vtop.ui.widgets.alerts_panel import AlertsPanel, RequestsLine
from vtop.ui.widgets.frame_memo import MemoScreen, MemoStatic, MemoVertical, MemoVerticalScroll
from vtop.ui.widgets.gpu_panel import GpuPanel
from vtop.ui.widgets.keys_bar import KeysBar
from vtop.ui.widgets.log_pane import LogPane
from vtop.ui.widgets.startup_panel import StartupPanel

if TYPE_CHECKING:
    from vtop.core.diagnose import Diagnoser
    from vtop.sources.logwatch import LogView, LogWatch

# Modules the first frame does not need (the log parser with its ~60 regular
# expressions, the diagnosis rules, the recorder, the snapshot code) are
# imported where they are first used: each costs 10-60 ms at start-up.

GIB = 2**30
SERVER_PANEL_MIN_ROWS = 6


class GpuSourceLike(Protocol):
    def poll(self) -> GpuPoll: ...
    def close(self) -> None: ...


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
        replay: Any = None,
    ) -> None:
        super().__init__()
        #: a :class:`~vtop.ui.replay.ReplayDriver` when playing a recording
        self.replay = replay
        if replay is not None:
            gpu_source, autopoll = None, False
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
        self.recorder = None
        if config.record:
            from vtop.sources.record import Recorder

            self.recorder = (Recorder(config.record, max_bytes=config.record_max_mb * 2**20,
                                  redact_prompts=config.redact_prompts,
                                  meta={"interval": config.interval, "history": config.history}))
        self.gpu_loop: PollLoop | None = None
        self.log_watch: LogWatch | None
        if replay is not None:
            from vtop.sources.logwatch import LogWatch
            from vtop.ui.replay import FedLog

            self.log_watch = (LogWatch(FedLog(replay.name), clock=replay.clock, stall_threshold_s=config.stall_threshold)
                              if replay.has_log else None)
        elif isinstance(log_watch, str):
            self.log_watch = self._make_log_watch(config, log_fd)
        else:
            self.log_watch = log_watch
        if self.log_watch is not None and self.recorder is not None:
            self.log_watch.recorder = self.recorder
        self.log_loop: PollLoop | None = None
        self.servers = ServerWatch(self, clock=replay.clock if replay is not None else None)
        self._dirty: set[str] = set()
        self._widgets: dict[str, Any] = {}
        self._snapshots: Any = None
        self._snapshot_busy = False
        self._snap_pct = -5
        self._snap_text = ""
        self.last_snapshot: Any = None
        self._launch_marked: Any = None
        self.log_view: LogView | None = None
        self.gpu_hung = False
        self._status_text = ""
        self._ticks = 0
        self._log_tried_for: tuple[Any, ...] = ()  # the servers a log was last looked for among
        self._diagnoser: Diagnoser | None = None
        self.alerts: list[Any] = []
        self._alerts_key: Any = None

    @property
    def diagnoser(self) -> Diagnoser:
        if self._diagnoser is None:
            from vtop.core.diagnose import Diagnoser, Thresholds

            self._diagnoser = Diagnoser(Thresholds(runaway_s=self.config.runaway_threshold))
        return self._diagnoser

    @diagnoser.setter
    def diagnoser(self, value: Diagnoser) -> None:
        self._diagnoser = value

    @property
    def snapshots(self) -> Any:
        """The snapshot runner (``s``), made when first used."""
        if self._snapshots is None:
            from vtop.actions.snapshot import SnapshotRunner

            self._snapshots = SnapshotRunner()
        return self._snapshots

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
        """Textual's own driver, except on Linux: the same with a key thread that sleeps
        while nobody types (:mod:`vtop.ui.driver`). ``TEXTUAL_DRIVER`` still wins."""
        if os.environ.get("TEXTUAL_DRIVER"):
            return super().get_driver_class()
        from vtop.ui.driver import calm_driver_class

        return calm_driver_class() or super().get_driver_class()

    # ------------------------------------------------------------------ layout
    def get_default_screen(self) -> Screen[Any]:
        return MemoScreen(id="_default")

    def compose(self) -> ComposeResult:
        yield MemoStatic("", id="status")
        yield AlertsPanel(id="alerts")
        with MemoVerticalScroll(id="body"):
            yield GpuPanel(self.gpu_history, procs_line=self.procs_line, id="gpus")
            with MemoVertical(id="servers"):
                yield MemoStatic("vLLM: looking for servers on this box…", id="servers-msg")
                yield RequestsLine(id="requests-line")
            yield StartupPanel(gpu_activity=self.gpu_activity, id="startup")
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
        self._widget("gpu", GpuPanel)
        self._widget("startup", StartupPanel)
        self._widget("log", LogPane)
        self.servers.on_view.append(self._on_server_view)
        self.servers.on_first_discovery.append(self._on_first_discovery)
        self.servers.on_discovery.append(self._on_discovery)
        if self.replay is not None:
            if not self.replay.has_gpu:
                self._apply_gpu(GpuPoll(t=0.0, mono=0.0, status=OFF, message="no GPU samples in this recording"))
        elif self.gpu_source is None:
            self._apply_gpu(GpuPoll(t=0.0, mono=0.0, status=OFF, message="GPU panel off (--no-gpu)."))
        # No log watched: the pane would only take room from the charts.
        self.w_log.display = self.log_watch is not None
        self.w_startup.redraw()
        self._size_panels()
        self.update_status()
        if self.autopoll:
            self.servers.add_cli_urls()
            # After the first frame: the poll threads' start (NVML init, the first
            # /proc scan) competes for the GIL with drawing it.
            self.call_after_refresh(self._start_polling)
        elif self.replay is not None:
            from vtop.ui.replay import TICK_S

            self.replay.attach(self)
            self.replay.advance(0.0)
            self.replay.timer = self.set_interval(TICK_S, self.replay.on_timer, name="replay")
            if self.replay.paused or self.replay.ended:
                self.replay.timer.pause()

    def _start_polling(self) -> None:
        if self.gpu_source is not None:
            self.gpu_loop = PollLoop(self, "gpu", self.config.interval, self._gpu_poll_blocking, self._on_gpu_result,
                                     at_tick=True)
            self.gpu_loop.start()
        if self.log_watch is not None:
            self._start_log_loop()
        self.servers.start()
        self.set_interval(self.config.interval, self._tick, name="paint")

    def on_resize(self) -> None:
        self._size_panels()

    def _size_panels(self) -> None:
        panel = self.w_gpu
        panel.max_gap = max(2.5 * self.config.interval, self.config.interval + 1.0)
        panel.max_height = max(1, self.size.height - 2 - SERVER_PANEL_MIN_ROWS)
        panel.relayout()

    # ----------------------------------------------------------------- polling
    def _gpu_poll_blocking(self) -> tuple[GpuPoll, dict[int, str]]:
        """Runs in a thread worker: NVML, psutil and the recorder's file I/O."""
        assert self.gpu_source is not None
        poll = self.gpu_source.poll()
        names = self._names.names_for((p.pid for g in poll.gpus for p in (g.procs or ())), poll.mono)
        if self.recorder is not None:
            self.recorder.gpu(poll, names)
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
        self.gpu_hung = False
        self._dirty.add("gpu")
        self._paint_soon()

    def _paint_soon(self) -> None:
        """Paint now when driven by hand (tests, replays); else at the next paint tick."""
        if not self.autopoll and self.replay is None:
            self.paint()

    def paint(self) -> None:
        """Apply everything that arrived since the last paint, in one batch.

        Sources deliver whenever their poll ends (NVML after 1 ms, a scrape after
        20 ms, the log in between); painting each as it came meant up to three
        full compositor passes a second. One paint per interval is one pass.
        """
        dirty, self._dirty = self._dirty, set()
        with self.batch_update():
            if "gpu" in dirty:
                panel = self.w_gpu
                if panel.has_class("-stale") and not self.gpu_hung:
                    panel.remove_class("-stale")
                poll = self.gpu_history.last_poll
                panel.update_view(poll.mono if poll else 0.0)
            if "log" in dirty and self.log_view is not None:
                self.w_startup.show(self.log_view)
                self.w_log.show(self.log_view)
            if "servers" in dirty:
                self.servers.paint()
            if "log" in dirty:
                self._widget("requests", RequestsLine).show_requests(self.log_view)
            if dirty:
                self.diagnose()
            self.update_status()

    # ---------------------------------------------------------------- the log
    @staticmethod
    def _make_log_watch(config: Config, log_fd: int | None) -> LogWatch | None:
        if not config.log:
            return None
        from vtop.sources.logtail import LogTailer, StreamTailer
        from vtop.sources.logwatch import LogWatch

        src = StreamTailer(log_fd if log_fd is not None else 0) if config.log == "-" else LogTailer(config.log)
        return LogWatch(src, stall_threshold_s=config.stall_threshold)

    def _start_log_loop(self) -> None:
        assert self.log_watch is not None
        self.log_loop = PollLoop(self, "log", self.config.interval, self.log_watch.poll, self._on_log_result,
                                 at_tick=True)
        self.log_loop.start()

    def _on_first_discovery(self, servers: list[Any]) -> None:
        """No --log given: follow the log of the first server found, or say why not.
        Tried again (from :meth:`_on_discovery`) whenever the servers found change while
        no log is followed: vLLM is often started after vtop."""
        if self.config.log or self.log_watch is not None or self.replay is not None:
            return
        self._log_tried_for = tuple(sp.key for sp in servers)
        panel = self.w_startup
        if not servers:
            panel.set_message("vLLM log: no vLLM process on this box to read it from; pass --log PATH (or --log -). "
                              "Nothing to watch here? `vtop demo` plays a real incident recorded on an H200.")
            return
        if self.config.urls:
            # URLs given: only a server behind one of them is ours to follow.
            mine = [sp for sp in servers if any(self.servers._matches(u, sp) for u in self.servers.entries)]
            if not mine:
                panel.set_message("vLLM log: none of the given URLs is served by a vLLM process on this box; "
                                  "pass --log PATH (or --log -)")
                return
            servers = mine
        sp = servers[0]
        from vtop.sources.logwatch import LogWatch

        watch, where = LogWatch.for_server(sp, clock=self.servers.clock, stall_threshold_s=self.config.stall_threshold)
        if watch is None:
            panel.set_message(f"vLLM log: {where}")
            return
        self.log_watch = watch
        self.log_watch.recorder = self.recorder
        self._launch_marked = sp.key
        panel.set_message(f"vLLM log: {where}")
        self.w_log.display = True
        if self.autopoll:
            self._start_log_loop()

    def _on_discovery(self, servers: list[Any]) -> None:
        """A log given with --log: take the launch time of the server that writes it from the process table."""
        if self.log_watch is None:
            if servers and tuple(sp.key for sp in servers) != self._log_tried_for:
                self._on_first_discovery(servers)
            return
        if not servers or self.replay is not None:
            return
        sp = servers[0]
        if self._launch_marked == sp.key:
            return
        self._launch_marked = sp.key
        self.log_watch.mark_launch_of(sp)

    def diagnose(self, *, show: bool = True) -> list[Any]:
        """Run the rules over what is on screen now; show and record what changed.

        The rules keep state between calls (when a request last finished, how long the
        counters have been flat), so they must see every poll: live, the paint tick does
        that; a replay that jumps calls this after every recorded poll with ``show=False``."""
        now = self.servers.clock.monotonic()
        views = {url: e.last_view for url, e in self.servers.entries.items() if e.last_view is not None}
        lv = self.log_view
        target = None
        if lv is not None and self.servers.entries:
            e = self._action_entry()
            target = e.url if e is not None else None
        alerts = self.diagnoser.update_from(now, servers=views, gpus=self.gpu_history if self.gpu_history.tracks else None,
                                            log=lv, log_target=target)
        self.alerts = alerts
        if show:
            self._widget("alerts", AlertsPanel).show_alerts(alerts)
        key = tuple((a.rule, a.severity, a.target) for a in alerts)
        if key != self._alerts_key:
            self._alerts_key = key
            if self.recorder is not None:
                self.recorder.alerts(self.servers.clock.time(), now, [a.to_json() for a in alerts])
        return alerts

    def mount_server_card(self, card: Any) -> None:
        box = self.query_one("#servers", Vertical)
        box.mount(card, before=self.query_one("#requests-line"))
        self.query_one("#servers-msg", Static).display = False

    def _on_server_view(self, entry: Any, view: Any) -> None:
        if self.log_watch is not None and entry is self._action_entry():
            self.log_watch.note_server(view, self.servers.clock.monotonic())
        if (self.log_watch is not None and self.replay is None and view.health == 200
                and view.state in ("up", "restarted")):
            self.log_watch.mark_ready(self.servers.clock.monotonic())
        self._dirty.add("servers")
        self._paint_soon()

    async def poll_log_once(self) -> LogView | None:
        """Tests: one log poll through a real thread, applied on the UI thread."""
        if self.log_watch is None:
            return None
        view = await asyncio.to_thread(self.log_watch.poll)
        self._on_log_result(view, None)
        return view

    def _on_log_result(self, view: Any, error: BaseException | None) -> None:
        panel = self.w_startup
        if error is not None:
            panel.set_message(f"vLLM log: reading failed: {type(error).__name__}: {error}")
            return
        self.log_view = view
        self._dirty.add("log")
        self._paint_soon()

    def gpu_activity(self, since_mono: float) -> tuple[float | None, float | None]:
        """Mean GPU util and SM activity since ``since_mono`` (the busiest GPU), for the stall note."""
        best: tuple[float | None, float | None] = (None, None)
        for tr in self.gpu_history.tracks.values():
            util = [v for t, v in tr.series["util"] if t >= since_mono and v is not None]
            sm = [v for t, v in tr.series["sm"] if t >= since_mono and v is not None]
            if not util:
                continue
            u = sum(util) / len(util)
            s = sum(sm) / len(sm) if sm else None
            if best[0] is None or u > best[0]:
                best = (u, s)
        return best

    #: Paint ticks after which start-up counts as over (:func:`vtop.gc_tuning.settle_gc`):
    #: by the third, every source has answered once and its modules are imported.
    SETTLE_GC_AFTER_TICKS = 3

    def _tick(self) -> None:
        """Every interval: paint what arrived, and notice sources that went quiet."""
        for loop in (self.gpu_loop, self.log_loop):
            if loop is not None:
                loop.collect()
        self.servers.tick()
        self.paint()
        self._watchdog()
        self._ticks += 1
        if self._ticks == self.SETTLE_GC_AFTER_TICKS and not self.is_headless:
            # Not under a test's Pilot (headless): freezing a test process's objects is not ours to do.
            from vtop.gc_tuning import settle_gc

            settle_gc()

    def _watchdog(self) -> None:
        loop = self.gpu_loop
        if loop is None:
            return
        hung = loop.in_flight_for() > self.hang_after_s
        if hung or self.gpu_hung:
            self.gpu_hung = hung
            self.w_gpu.set_class(hung, "-stale")
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

    def server_status_text(self) -> str:
        views = [e.last_view for e in self.servers.entries.values() if e.last_view is not None]
        if not views:
            return "vLLM: looking…"
        if len(views) == 1:
            return f"vLLM: {views[0].state}"
        counts: dict[str, int] = {}
        for v in views:
            counts[v.state] = counts.get(v.state, 0) + 1
        return "vLLM: " + ", ".join(f"{n} {st}" for st, n in counts.items())

    def reset_state(self) -> None:
        """Forget everything seen (a replay seeking back)."""
        self.gpu_history.tracks.clear()
        self.gpu_history.last_poll = None
        self.proc_names = {}
        self.servers.reset()
        from vtop.core.diagnose import Diagnoser

        self.diagnoser = Diagnoser(self.diagnoser.thresholds)  # its history ran ahead of the new position
        self.alerts = []
        self._alerts_key = None
        if self.log_watch is not None:
            self.log_watch.reset()
        self._dirty.update(("gpu", "log", "servers"))
        for e in self.servers.entries.values():
            e.dirty = True

    def update_status(self) -> None:
        if self.replay is not None:
            text = f" {self.replay.status_text()} │ {self.gpu_status_text()} │ {self.server_status_text()}"
            if text != self._status_text:
                self._status_text = text
                status = self._widgets.get("status") or self._widgets.setdefault("status", self.query_one("#status", Static))
                status.update(text)
            return
        rec = self.recorder
        rec_text = "" if rec is None else (f" │ {rec.stopped_reason}" if rec.stopped_reason else " │ ● REC")
        text = (f" vtop {__version__} │ {self.hostname} │ {self.gpu_status_text()} │ {self.server_status_text()}"
                f" │ every {self.config.interval:g} s" + rec_text + (" │ READ-ONLY" if self.config.readonly else "")
                + (f" │ {self._snap_text}" if getattr(self, "_snap_text", "") else ""))
        if text != self._status_text:
            self._status_text = text
            status = self._widgets.get("status") or self._widgets.setdefault("status", self.query_one("#status", Static))
            status.update(text)

    def procs_line(self, g: GpuSample) -> str:
        if not g.procs:
            return "no compute process" if g.procs is not None else ""
        parts = []
        for p in sorted(g.procs, key=lambda p: -(p.used_bytes or 0))[:3]:
            name = self.servers.gpu_owner.get(p.pid) or self.proc_names.get(p.pid, "")
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

    def _action_entry(self) -> Any:
        """The server the action keys act on: the first one with a process, else the first."""
        entries = list(self.servers.entries.values())
        with_proc = [e for e in entries if e.process is not None]
        return (with_proc or entries or [None])[0]

    def latest_snapshot_folder(self) -> Any:
        from vtop.actions.snapshot import latest_bundle

        return self.snapshots.last_path or latest_bundle(self.config.snapshot_dir)

    def history_json(self) -> dict[str, Any]:
        def pts(series: Any) -> list[list[float | None]]:
            return [[round(t, 3), v] for t, v in series]

        return {
            "gpus": {str(i): {k: pts(s) for k, s in tr.series.items()} for i, tr in self.gpu_history.tracks.items()},
            "servers": {url: {k: pts(s) for k, s in e.last_view.series.items()} if e.last_view else {}
                        for url, e in self.servers.entries.items()},
        }

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
        for url in self.servers.entries:
            try:
                _, body = await asyncio.wait_for(
                    self.servers.client.get(url + "/metrics", headers=[("Accept-Encoding", "identity")],
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
            servers=[e.process for e in self.servers.entries.values() if e.process is not None],
            metrics_texts=metrics,
            history_json=self.history_json(),
            phases_json=phases,
            alerts=[a.to_json() for a in self.alerts],
            screen_svg=self.export_screenshot(),
            redact_prompts=self.config.redact_prompts,
            secrets=secrets,
            progress=self._snapshot_progress_from_thread,
        )
        res = await asyncio.wrap_future(fut)
        self.last_snapshot = res
        sev = "information" if res.ok else ("warning" if res.refused or res.path else "error")
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

        e = self._action_entry()
        if e is None or e.process is None:
            self.notify("py-spy: no vLLM process found on this box to dump (a remote URL cannot be dumped)",
                        severity="warning")
            return
        targets = pick_targets(e.process)
        if not targets:
            self.notify(f"py-spy: no process to dump under pid {e.process.pid}", severity="warning")
            return
        self.push_screen(PySpyScreen(targets[0], server=e.process))

    def action_test_request(self) -> None:
        from vtop.ui.screens import ProbeScreen

        e = self._action_entry()
        if e is None:
            self.notify("test request: no vLLM server watched", severity="warning")
            return
        v = e.last_view
        models = [v.model_id] if v is not None and v.model_id else ([e.process.served_name] if e.process and e.process.served_name else [])
        self.push_screen(ProbeScreen(e.url, models=models, max_model_len=v.max_model_len if v else None,
                                     client=self.servers.action_client, api_key=self.servers.api_key))

    # ----------------------------------------------------------------- actions
    def action_requests(self) -> None:
        from vtop.ui.screens import RequestsScreen

        self.push_screen(RequestsScreen())

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
        await self.servers.aclose()
        self.exit(0)

    def on_unmount(self) -> None:
        for loop in (self.gpu_loop, self.log_loop):
            if loop is not None:
                loop.stop()
        self.servers.stop()
        if self.recorder is not None:
            self.recorder.close()
