"""The keys that change what the screen shows: help, freeze, the poll interval, the log pane's
filters and toggles, the panels' toggles, the full-screen views (processes, requests, alerts), and
the short notes at the end of the status line. A mixin of :class:`vtop.ui.app.VtopApp`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.app import App
from textual.binding import Binding

if TYPE_CHECKING:
    from vtop.config import Config
    from vtop.monitor import Monitor
    from vtop.monitor.live import LiveFeed
    from vtop.monitor.logwatch import LogView
    from vtop.monitor.player import Player
    from vtop.ui.widgets.gpu_panel import GpuPanel
    from vtop.ui.widgets.log_pane import LogPane
    from vtop.ui.widgets.server_panel import ServerCard
    from vtop.ui.widgets.startup_panel import StartupPanel


class ViewKeys(App[int]):
    if TYPE_CHECKING:  # the app's (vtop.ui.app.VtopApp)
        config: Config
        monitor: Monitor
        feed: LiveFeed | None
        replay: Player | None
        cards: dict[str, ServerCard]
        frozen: bool
        log_wanted: bool
        log_forced: bool
        _note: str
        _note_timer: Any
        _status_text: str
        _paint_timer: Any

        @property
        def w_gpu(self) -> GpuPanel: ...

        @property
        def w_startup(self) -> StartupPanel: ...

        @property
        def w_log(self) -> LogPane: ...

        @property
        def log_view(self) -> LogView | None: ...

        def update_status(self) -> None: ...

        def paint(self) -> None: ...

        def _fit(self) -> None: ...

        def _tick(self) -> None: ...

    #: the poll intervals ``+``/``-`` step through (the config's bounds: at least 0.25 s)
    INTERVALS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)

    def say(self, note: str, seconds: float = 6.0) -> None:
        """A short note at the end of the status line, gone after ``seconds``."""
        self._note = note
        if self._note_timer is not None:
            self._note_timer.stop()
        self._note_timer = self.set_timer(seconds, self._clear_note)
        self._status_text = ""
        self.update_status()

    def _clear_note(self) -> None:
        self._note = ""
        self.update_status()

    def action_help(self) -> None:
        from vtop.ui.screens import HelpScreen

        self.push_screen(HelpScreen(self.help_keys(), self.help_notes()))

    #: what each key does, in the help screen's words (the footer has room for one word)
    KEY_HELP = {
        "help": "this help",
        "quit": "quit",
        "alert_details": "every alert with every evidence line and every fix, whole and scrollable",
        "freeze": "freeze the screen to read it; polling, the histories and the alerts go on "
                  "(FROZEN in the status line); space again catches up",
        "poll_interval": "poll faster / slower (0.25 s at the shortest; the status line says the interval)",
        "toggle_compact": "GPU cards <-> one line per GPU (chosen from the room by default)",
        "toggle_detail": "server cards: each of spec decoding, prefix cache, queue time and HTTP errors, LoRA and "
                         "the cache config on a line of its own (folded to one line by default)",
        "toggle_phases": "unfold the startup timeline of a server that is already up",
        "toggle_log": "show or hide the log pane (it gives its rows to an alert first)",
        "toggle_warnings": "log pane: warnings and errors only",
        "toggle_probes": "log pane: show / hide uvicorn's access lines of /metrics, /health, /version, /v1/models "
                         "(hidden by default: vtop's own polls would bury the rest; the pane's foot names the "
                         "engine's flag that keeps them out of its log, and vLLM's --disable-uvicorn-access-log "
                         "drops every access line)",
        "filter_log": "log pane: only lines with a text (type it; Enter keeps it, Esc clears it)",
        "clear_filter": "clear the log filter",
        "processes": "processes: the GPU ones and each vLLM server's tree (API server, EngineCore, workers) "
                     "folded together, with GPU and host memory, CPU %, user, command; m c i sort",
        "timeline": "before vtop: what the vLLM log says happened before vtop started (and since): each start "
                    "with its phases and durations, ready, deaths, restarts, warnings and errors with counts, "
                    "the last stats line (doctor prints the same)",
        "requests": "requests in flight, oldest first, each running at least how long and by what evidence, "
                    "and the last finished",
        "snapshot": "snapshot: an incident bundle of log, /metrics, history, processes, screen",
        "pyspy": "py-spy dump of the EngineCore (or the workers for TP>1)",
        "test_request": "send a test request (max_tokens required)",
        "stop_request": "stop a request (the runaway's; in r, the selected one): closes its connection",
        "replay_pause": "pause / play",
        "replay_step": "one step (an interval) while paused",
        "replay_speed": "play faster / slower (1x to 60x)",
        "replay_seek": "seek: arrows 10 s, [ ] a minute, Home/End",
        "replay_chapter": "next / previous chapter of the recording",
        "replay_goto": "jump to that chapter of the recording",
    }

    def help_keys(self) -> list[tuple[str, str, bool]]:
        """(keys as shown, what they do, on here) for every key of the dashboard."""
        groups: dict[str, tuple[list[str], str, bool]] = {}
        for key, (_node, binding, enabled, _tip) in self.screen.active_bindings.items():
            name = binding.action.split("(")[0]
            if not hasattr(self, f"action_{name}") or key == "ctrl+q" or name == "quit" and key != "q":
                continue
            shown = "F1" if key == "f1" else self.get_key_display(binding) if binding.key_display else \
                self.get_key_display(Binding(key, binding.action))
            keys, _, on = groups.setdefault(name, ([], self.KEY_HELP.get(name, binding.description), enabled))
            if shown not in keys:
                keys.append(shown)
        return [("/".join(k), what, on) for k, what, on in groups.values()]

    def help_notes(self) -> list[str]:
        notes = []
        if self.config.readonly:
            notes.append("READ-ONLY (--readonly): the snapshot, py-spy, test-request and stop keys (s d t x) are off.")
        if self.replay is not None:
            notes.append("A replay: s, d, t and x would act on this box, not the recorded one, so they are off.")
        delivery = getattr(self, "delivery", None)
        if delivery is not None:  # --on-alert / --webhook (vtop/actions/alerts_out.py): URLs shown without secrets
            notes.append("Each start, severity change and clear of an incident goes to: " + ", ".join(delivery.labels)
                         + " (docs/watch.md).")
        return notes

    def action_freeze(self) -> None:
        self.frozen = not self.frozen
        self._status_text = ""
        if self.frozen:
            self.update_status()
        else:
            self.paint()

    def action_poll_interval(self, direction: int) -> None:
        """+ (direction -1): a shorter interval; - (1): a longer one; within the config's bounds
        (at least 0.25 s, at most a tenth of the history)."""
        feed = self.feed
        if feed is None:
            return
        cur = self.config.interval
        steps = [x for x in self.INTERVALS if x <= self.config.history / 10] or [cur]
        cand = [x for x in steps if (x < cur - 1e-9 if direction < 0 else x > cur + 1e-9)]
        if not cand:
            why = "the shortest" if direction < 0 else f"the longest for a {self.config.history:g} s history"
            self.say(f"interval stays {cur:g} s ({why})")
            return
        new = cand[-1] if direction < 0 else cand[0]
        feed.set_interval(new)
        self.config = feed.config
        if self._paint_timer is not None:
            self._paint_timer.stop()
            self._paint_timer = self.set_interval(new, self._tick, name="paint")
        gap = max(2.5 * new, new + 1.0)
        self.w_gpu.max_gap = gap
        for card in self.cards.values():
            card.max_gap = gap
        self.say(f"interval now {new:g} s (was {cur:g} s)")

    def action_filter_log(self) -> None:
        from textual.widgets import Input

        box = self.query_one("#log-filter", Input)
        if not self.w_log.display:
            self.log_wanted = self.log_forced = True
            self._fit()
        box.display = True
        box.focus()
        self._fit()

    def on_input_changed(self, event: Any) -> None:
        if getattr(event.input, "id", None) == "log-filter":
            self.w_log.set_substring(event.value)

    def on_input_submitted(self, event: Any) -> None:
        if getattr(event.input, "id", None) == "log-filter":
            box = event.input
            box.display = bool(event.value)
            self.screen.set_focus(None)
            self._fit()

    def action_clear_filter(self) -> None:
        from textual.widgets import Input

        box = self.query_one("#log-filter", Input)
        if box.value or box.display:
            box.value = ""
            box.display = False
            self.w_log.set_substring("")
            self.screen.set_focus(None)
            self._fit()

    def action_processes(self) -> None:
        from vtop.ui.screens import ProcessScreen

        self.push_screen(ProcessScreen(self.monitor, live=self.replay is None))

    def action_requests(self) -> None:
        from vtop.ui.screens import RequestsScreen

        m = self.monitor
        self.push_screen(RequestsScreen(lambda: m.in_flight, lambda: self.log_view))

    def action_timeline(self) -> None:
        from vtop.ui.screens import TimelineScreen

        self.push_screen(TimelineScreen(self.monitor.timeline))

    def action_alert_details(self) -> None:
        from vtop.ui.screens import AlertsScreen

        self.push_screen(AlertsScreen(lambda: self.monitor.alerts))

    def action_toggle_compact(self) -> None:
        self.w_gpu.toggle_compact()

    def action_toggle_detail(self) -> None:
        on = not any(c.detail for c in self.cards.values())
        for c in self.cards.values():
            c.detail = on
            if c.view is not None:
                c.show(c.view, c.now)
        self._fit()  # the cards' heights changed: share the rows again (also when paused or frozen)

    def action_toggle_phases(self) -> None:
        self.w_startup.toggle()

    def action_toggle_log(self) -> None:
        shown = self.w_log.display
        if not shown and self.log_wanted:
            self.log_forced = True  # an alert or the cards had taken its rows: the user wants it anyway
        else:
            self.log_wanted = not shown
            self.log_forced = self.log_wanted and self.log_forced
        self._fit()

    def action_toggle_probes(self) -> None:
        if not self.w_log.display:
            self.log_wanted = self.log_forced = True
        self.w_log.toggle_probes()
        self._fit()

    def action_toggle_warnings(self) -> None:
        if not self.w_log.display:
            self.log_wanted = self.log_forced = True
        self.w_log.toggle_filter()
        self._fit()
