"""Modal screens behind the action keys: the py-spy dump (``d``) and the test request (``t``).

Both run their work in async workers (``exclusive=True`` per screen), so the
screen and the dashboard behind it keep answering while a dump or a request
takes its time; each ends in a result or a clear error written on screen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from vtop.actions.probe import ProbeResult, send_test_request
from vtop.actions.pyspy import PySpyResult, Target, dump
from vtop.actions.stop import StopTarget, tokens_words
from vtop.core.engines import flags_of
from vtop.core.rules.util import short_url
from vtop.model.requests import EVIDENCE_WORDS, InFlightRequest, ServerRequests, age_words, dur_text, silent_words

DEFAULT_MAX_TOKENS = 64
WHY_MAX_TOKENS = (
    "vtop never sends a request without max_tokens: a chat request that omits it may generate "
    "up to max_model_len minus the prompt, and hold a GPU slot for minutes."
)


def dump_text(r: PySpyResult, label: str) -> Text:
    out = Text()
    if not r.ok:
        out.append(f"py-spy dump of {label} failed\n", style="bold red")
        out.append(r.message + "\n", style="red")
        if r.stderr:
            out.append(r.stderr.strip()[-800:] + "\n", style="dim")
        return out
    title = (r.process_title or "").splitlines()[0][:80] if r.process_title else ""
    out.append(f"{label}: {title} ({r.python_version or 'Python ?'})", style="bold")
    out.append(f"  {len(r.threads)} threads, {r.elapsed_s:.1f} s\n\n")
    for th in r.threads:
        out.append(f"Thread {th.tid} ({th.status}): {th.name}\n", style="bold" if th.active else "dim")
        for fr in th.frames:
            out.append(f"    {fr.text}\n")
    return out


class PySpyScreen(ModalScreen[None]):
    """A py-spy dump of one process, scrollable; ``n`` re-runs with native frames."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close"),
        Binding("n", "native", "Native frames"),
        Binding("a", "api_server", "API server"),
        Binding("s", "save", "Save to snapshot"),
    ]

    def __init__(self, target: Target, *, server: Any = None, timeout_s: float = 20.0, pyspy: str | None = None,
                 snapshot_folder: Callable[[], Any] = lambda: None) -> None:
        super().__init__()
        self.snapshot_folder = snapshot_folder
        """The latest snapshot folder (the incident's bundle), or None: where dumps are saved."""
        self.target = target
        self.server = server
        self.timeout_s = timeout_s
        self.pyspy = pyspy
        self.result: PySpyResult | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(f"py-spy dump · {self.target.label} (pid {self.target.pid})", id="dialog-title")
            with VerticalScroll(id="dump-scroll"):
                yield Static(f"running py-spy dump --pid {self.target.pid} …", id="dump")
            yield Label("esc close · n native frames · a the API server instead · s save into the latest snapshot",
                        id="dialog-keys")

    def on_mount(self) -> None:
        self.run_dump(False)

    @work(exclusive=True, group="pyspy", exit_on_error=False)
    async def run_dump(self, native: bool) -> None:
        self.query_one("#dump", Static).update(
            f"running py-spy dump{' --native' if native else ''} --pid {self.target.pid} …")
        r = await dump(self.target.pid, native=native, timeout_s=self.timeout_s, pyspy=self.pyspy)
        self.result = r
        self.query_one("#dump", Static).update(dump_text(r, self.target.label))
        self.query_one("#dialog-title", Label).update(f"py-spy dump · {self.target.label} (pid {self.target.pid})")
        if r.ok:
            self._autosave(r)

    def _autosave(self, r: PySpyResult) -> None:
        """Into the latest snapshot folder, when there is one (the incident's bundle)."""
        folder = self.snapshot_folder()
        if folder is not None:
            saved = r.save_into(folder)
            self.notify(saved.message, severity="information" if saved.ok else "error")

    def action_api_server(self) -> None:
        from vtop.actions.pyspy import pick_targets

        if self.server is None:
            self.notify("no server process known", severity="warning")
            return
        targets = pick_targets(self.server, role="api_server")
        if not targets:
            self.notify("no API server process found", severity="warning")
            return
        self.target = targets[0]
        self.run_dump(False)

    def action_native(self) -> None:
        self.run_dump(True)

    def action_save(self) -> None:
        if self.result is None or not self.result.ok:
            self.notify("nothing to save yet", severity="warning")
            return
        folder = self.snapshot_folder()
        if folder is None:
            self.notify("no snapshot folder yet: press s on the dashboard first", severity="warning")
            return
        saved = self.result.save_into(folder)
        self.notify(saved.message, severity="information" if saved.ok else "error")


class ProbeScreen(ModalScreen[None]):
    """The test request form. max_tokens is required."""

    BINDINGS = [Binding("escape", "dismiss", "Close")]

    def __init__(self, url: str, *, models: list[str], max_model_len: int | None, client: Any,
                 api_key: str | None, userinfo: str | None = None) -> None:
        super().__init__()
        self.url = url
        self.userinfo = userinfo
        self.models = models
        self.max_model_len = max_model_len
        self.client = client
        self.api_key = api_key
        self.result: ProbeResult | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(f"Test request · {self.url}", id="dialog-title")
            yield Input(self.models[0] if self.models else "", placeholder="model", id="model")
            with Horizontal(id="probe-row"):
                yield Select([("chat", "chat"), ("completions", "completions")], value="chat",
                             allow_blank=False, id="endpoint")
                yield Input(str(DEFAULT_MAX_TOKENS), placeholder="max_tokens (required)", id="max-tokens",
                            type="integer")
            yield Input("Say hello in five words.", placeholder="prompt", id="prompt")
            limit = f" (at most {self.max_model_len:,}, this server's max_model_len)" if self.max_model_len else ""
            yield Static(f"max_tokens is required{limit}. {WHY_MAX_TOKENS} temperature 0.", id="probe-why")
            yield Button("Send", id="send", variant="primary")
            with VerticalScroll(id="probe-scroll"):
                yield Static("", id="probe-result")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "send":
            self.send()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.send()

    @work(exclusive=True, group="probe", exit_on_error=False)
    async def send(self) -> None:
        out = self.query_one("#probe-result", Static)
        raw = self.query_one("#max-tokens", Input).value.strip()
        try:
            max_tokens: int | None = int(raw)
        except ValueError:
            max_tokens = None
        model = self.query_one("#model", Input).value.strip()
        endpoint = str(self.query_one("#endpoint", Select).value)
        prompt = self.query_one("#prompt", Input).value
        out.update(Text(f"sending to {self.url} ({endpoint}, max_tokens {raw or '-'}) …", style="dim"))
        r = await send_test_request(self.url, model=model, endpoint=endpoint,  # type: ignore[arg-type]
                                    prompt=prompt, max_tokens=max_tokens, max_model_len=self.max_model_len,
                                    api_key=self.api_key, client=self.client, userinfo=self.userinfo)
        self.result = r
        out.update(probe_text(r))


def probe_text(r: ProbeResult) -> Text:
    out = Text()
    out.append(("✓ " if r.ok else "✗ ") + r.message + "\n", style="bold" if r.ok else "bold red")
    if r.sent and r.status is not None:
        def f(v: float | None, unit: str) -> str:
            return "-" if v is None else f"{v:.3f} {unit}" if unit == "s" else f"{v:.1f} {unit}"

        out.append(f"TTFT {f(r.ttft_s, 's')} · total {f(r.total_s, 's')} · {f(r.tokens_per_s, 'tok/s')} · "
                   f"output tokens {r.output_tokens if r.output_tokens is not None else '-'}"
                   f"{'' if r.tokens_from_usage else ' (counted)'} · finish_reason {r.finish_reason or '-'}\n")
        if r.text:
            out.append("\n" + r.text + ("…" if r.text_truncated else "") + "\n", style="italic")
    return out


def request_rows(answers: Mapping[str, ServerRequests]) -> list[tuple[str, ...]]:
    """The ``r`` table's rows: every server's requests in flight, oldest first (the one answer:
    :func:`vtop.core.requests.requests_in_flight`), the oldest marked; its age as a lower bound
    ("in flight at least"), the upper bound in its own column ("came at most ... ago")."""
    rows: list[tuple[str, ...]] = []
    for url, a in answers.items():
        for r in a.requests:
            note = "oldest" if r is a.oldest else ""
            if r.no_client_max_tokens:
                note = (note + " · " if note else "") + "no max_tokens from client"
            if r.answer_pending:
                note = (note + " · " if note else "") + "answer not begun"
            if r.answer_silent_s is not None:
                note = (note + " · " if note else "") + silent_words(r.answer_silent_s)
            rows.append((short_url(url), r.request_id or "-", r.client or "-",
                         "?" if r.age_min_s is None else f"at least {dur_text(r.age_min_s)}",
                         "-" if r.age_max_s is None else f"at most {dur_text(r.age_max_s)} ago",
                         "-" if r.max_tokens is None else f"{r.max_tokens:,}",
                         " + ".join(EVIDENCE_WORDS.get(e, e) for e in r.evidence), note))
    return rows


class RequestsScreen(ModalScreen[None]):
    """``r``: every server's requests in flight, oldest first, each with its age as a lower bound and
    what proves it (the request log, its connection, /metrics), and the request log's last finished.

    Refreshed from the monitor's latest answer once a second; prompts are never shown (the log may
    hold them up to vLLM 0.11; vtop keeps only their length).
    """

    BINDINGS = [Binding("escape,q,r", "dismiss", "Close"), Binding("x", "stop_request", "Stop")]

    def __init__(self, answers: Callable[[], Mapping[str, ServerRequests]],
                 log_view: Callable[[], Any] | None = None) -> None:
        super().__init__()
        self.answers = answers
        """Per server, its requests in flight (:attr:`vtop.monitor.Monitor.in_flight`)."""
        self.log_view = log_view or (lambda: None)
        """The latest log view (a :class:`~vtop.monitor.logwatch.LogView`, for the finished ones), or None."""
        self.shown: list[tuple[str, InFlightRequest]] = []
        """The requests of the table's rows, in order (what ``x`` stops)."""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop_request":
            return self.app.check_action(action, parameters)  # the app's gating: --readonly, a replay
        return True

    def action_stop_request(self) -> None:
        from textual.widgets import DataTable

        row = self.query_one("#req-table", DataTable).cursor_row
        if not self.shown or not 0 <= row < len(self.shown):
            self.notify("stop: no request in flight is listed", severity="warning")
            return
        url, r = self.shown[row]
        self.app.open_stop(url, r)  # type: ignore[attr-defined]

    def compose(self) -> ComposeResult:
        from textual.widgets import DataTable

        with Vertical(id="dialog"):
            yield Label("Requests in flight", id="dialog-title")
            yield Static("", id="req-note")
            yield DataTable(id="req-table", cursor_type="row", zebra_stripes=False)
            yield Label("Recently finished (the vLLM request log)", id="req-done-title")
            yield DataTable(id="req-done", cursor_type="row")
            yield Label("esc close · x stop the selected request · in flight at least: what the evidence proves · "
                        "took ≤: at most (its end inferred)",
                        id="dialog-keys")

    def on_mount(self) -> None:
        from textual.widgets import DataTable

        t = self.query_one("#req-table", DataTable)
        t.add_columns("server", "request id", "client", "in flight", "came", "max_tokens", "evidence", "note")
        d = self.query_one("#req-done", DataTable)
        d.add_columns("request id", "kind", "took", "ended by", "max_tokens", "note")
        self.refresh_rows()
        self.set_interval(1.0, self.refresh_rows)

    def refresh_rows(self) -> None:
        from textual.widgets import DataTable

        from vtop.ui.widgets.alerts_panel import age_text

        answers = self.answers()
        note = self.query_one("#req-note", Static)
        t = self.query_one("#req-table", DataTable)
        d = self.query_one("#req-done", DataTable)
        row_at = t.cursor_row
        t.clear()
        d.clear()
        for row in request_rows(answers):
            t.add_row(*row)
        self.shown = [(url, r) for url, a in answers.items() for r in a.requests]
        if self.shown and 0 < row_at < len(self.shown):
            t.move_cursor(row=row_at)
        note.update(self.note_text(answers))
        view = self.log_view()
        for f in (view.recent_finished[:30] if view is not None else ()):
            d.add_row(f.request_id, f.endpoint or "-", age_text(f.duration_s, f.duration_is_upper_bound), f.reason,
                      "-" if f.max_tokens is None else f"{f.max_tokens:,}",
                      "no max_tokens from client" if f.no_client_max_tokens else "")

    @staticmethod
    def note_text(answers: Mapping[str, ServerRequests]) -> str:
        """Per server: how many in flight (the engine's running + waiting), and what the request log says
        (where it has no request lines: the flag of the server's engine that turns them on)."""
        out = []
        for url, a in answers.items():
            line = f"{short_url(url)}: {'?' if a.count is None else a.count} in flight"
            if a.request_logging is False or a.request_logging is None:
                fl = flags_of(a.engine)  # the engine's own words, from its table (as the rules' fixes)
                since = f" {fl['log_requests_since']}+" if fl["log_requests_since"] else ""
                line += f" · no request lines in the log ({fl['name']}{since} logs them with {fl['log_requests']})"
            elif a.finishes_logged:
                line += " · the request log has end lines: its ages are exact"
            else:
                line += (f" · {a.received_recent} received in the last 10 s by the request log (it logs no end "
                         "line for every request: an entry may have ended unseen, only those proven still running "
                         "are listed)")
            out.append(line)
        return "\n".join(out) or "No server watched."


def stop_text(t: StopTarget | None, r: InFlightRequest, url: str, why_not: str | None) -> Text:
    """The confirmation: the request (its id when known), its client, its age and what is known of its
    tokens so far (all from the one answer, :class:`~vtop.model.requests.InFlightRequest`), and how."""
    out = Text()
    out.append("Stop this request?\n\n" if why_not is None else "This request cannot be stopped from here.\n\n",
               style="bold")
    rows = [("request", r.request_id or "id not known (vLLM logs ids only with request logging on)"),
            ("client", r.client or "not known"), ("server", short_url(url)),
            ("in flight", age_words(r, upper=True)), ("tokens so far", tokens_words(r)),
            ("max_tokens", "not known" if r.max_tokens is None else
             f"{r.max_tokens:,}" + (" (vLLM's; its client sent none)" if r.no_client_max_tokens else "")),
            ("known by", " + ".join(EVIDENCE_WORDS.get(e, e) for e in r.evidence))]
    for k, v in rows:
        out.append(f"{k:>14}  ", style="dim")
        out.append(v + "\n")
    out.append("\n")
    if why_not is not None:
        out.append(why_not + "\n", style="bold red")
        return out
    assert t is not None
    out.append(f"vtop closes its TCP connection on the server's side (SOCK_DESTROY, as ss -K, {t.where}); vLLM "
               "aborts a request whose client hung up, and its client sees the connection reset. Other requests "
               "go on.\n", style="dim")
    return out


class StopScreen(ModalScreen[None]):
    """``x``: the confirmation of a stop, then its result line (the close and vLLM's abort are watched by
    the app: closing this screen does not stop the watching)."""

    BINDINGS = [Binding("escape,n,q", "dismiss", "Close"), Binding("y,enter", "confirm", "Stop it")]

    def __init__(self, url: str, r: InFlightRequest, target: StopTarget | None, why_not: str | None,
                 start: Callable[[StopTarget, Callable[[str, bool | None], None]], None]) -> None:
        super().__init__()
        self.url, self.request, self.target, self.why_not = url, r, target, why_not
        self.start = start
        self.started = False
        self.result_line = ""
        self.outcome: bool | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(f"Stop one request · {short_url(self.url)}", id="dialog-title")
            yield Static(stop_text(self.target, self.request, self.url, self.why_not), id="stop-body")
            yield Static("", id="stop-result")
            yield Label("esc close" if self.why_not else "y / enter: stop it · n / esc: cancel", id="dialog-keys")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "confirm":
            return self.why_not is None and not self.started
        return True

    def action_confirm(self) -> None:
        if self.target is None or self.started:
            return
        self.started = True
        self.query_one("#dialog-keys", Label).update("esc close (the result also shows in the status line)")
        self.show_result("closing its connection …", None)
        self.start(self.target, self.show_result)
        self.refresh_bindings()

    def show_result(self, line: str, stopped: bool | None) -> None:
        """The result line (from the app's watch): ``stopped``: True / False when known, else None."""
        self.result_line, self.outcome = line, stopped
        style = "bold green" if stopped else "bold red" if stopped is False else "italic"
        if self.is_mounted:
            self.query_one("#stop-result", Static).update(Text(line, style=style))


class AlertsScreen(ModalScreen[None]):
    """``e``: every alert with every evidence line and every fix, whole, scrollable, full height.

    Follows the app's alerts while open (once a second), so an alert that clears or a
    new one shows here too."""

    BINDINGS = [
        Binding("escape,q,e", "dismiss", "Close"),
        Binding("up,k", "scroll(-1)", "Up", show=False),
        Binding("down,j", "scroll(1)", "Down", show=False),
        Binding("pageup", "scroll(-10)", "Page up", show=False),
        Binding("pagedown,space", "scroll(10)", "Page down", show=False),
    ]

    def __init__(self, alerts: Callable[[], Any]) -> None:
        super().__init__()
        self.alerts = alerts
        """The app's alerts now (a callable: the screen follows them)."""
        self._key: Any = None

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="-full"):
            yield Label("Alerts: every line, every fix", id="dialog-title")
            with VerticalScroll(id="alerts-scroll"):
                yield Static("", id="alerts-all")
            yield Label("esc/e close · ↑↓ PgUp PgDn scroll", id="dialog-keys")

    def on_mount(self) -> None:
        self.refresh_alerts()
        self.set_interval(1.0, self.refresh_alerts)

    def refresh_alerts(self) -> None:
        from vtop.ui.widgets.alerts_panel import render_alerts

        alerts = list(self.alerts())
        key = tuple((a.rule, a.title, a.evidence, a.fix) for a in alerts)
        if key == self._key:
            return
        self._key = key
        body = render_alerts(alerts, everything=True) if alerts else Text("No alert now.", style="dim")
        self.query_one("#alerts-all", Static).update(body)

    def action_scroll(self, rows: int) -> None:
        self.query_one("#alerts-scroll", VerticalScroll).scroll_relative(y=rows, animate=False)


class TimelineScreen(ModalScreen[None]):
    """``h``: what the vLLM log says happened before vtop started (and since): the starts with their
    phases and durations, ready, deaths, restarts, warnings and errors with counts, the last stats
    line (:mod:`vtop.core.timeline`, the one answer ``doctor`` and the snapshot bundle give too).
    Follows the log while open (once a second)."""

    BINDINGS = [
        Binding("escape,q,h", "dismiss", "Close"),
        Binding("up,k", "scroll(-1)", "Up", show=False),
        Binding("down,j", "scroll(1)", "Down", show=False),
        Binding("pageup", "scroll(-10)", "Page up", show=False),
        Binding("pagedown,space", "scroll(10)", "Page down", show=False),
    ]

    def __init__(self, timeline: Callable[[], Any]) -> None:
        super().__init__()
        self.timeline = timeline
        """The monitor's timeline now (a callable: the screen follows it)."""
        self._text: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="-full"):
            yield Label("Before vtop: what the vLLM log says happened", id="dialog-title")
            with VerticalScroll(id="timeline-scroll"):
                yield Static("", id="timeline-all", markup=False)
            yield Label("esc/h close · ↑↓ PgUp PgDn scroll", id="dialog-keys")

    def on_mount(self) -> None:
        self.refresh_timeline()
        self.set_interval(1.0, self.refresh_timeline)

    def refresh_timeline(self) -> None:
        tl = self.timeline()
        text = "\n".join(tl.lines()) if tl is not None else (
            "No vLLM log is followed, or nothing was read from it yet: vtop knows nothing of the time "
            "before it started. (--log PATH names the server's log; vtop finds a local server's by itself.)")
        if text != self._text:
            self._text = text
            self.query_one("#timeline-all", Static).update(text)

    def action_scroll(self, rows: int) -> None:
        self.query_one("#timeline-scroll", VerticalScroll).scroll_relative(y=rows, animate=False)


#: What each part of the screen shows, for the help screen (``?``, F1).
ROWS_HELP = (
    ("status line", "vtop's version, the host, the GPUs (SIMULATED with --simulate-gpus), the vLLM servers' states, "
                    "the poll interval, ● REC when recording, FROZEN when space froze the screen"),
    ("alerts", "what is wrong, the numbers behind it, and the fix: ✖ CRITICAL, ▲ WARNING, ● info. "
               "While one is on, the log pane gives up its rows; e shows every line"),
    ("GPU card", "util: NVML GPU-Util (a kernel was running); SM act: the share of the SMs busy (GPM, Hopper+); "
                 "mem: memory used; bw: DRAM bandwidth. Charts are 0-100 %, newest on the right; "
                 "right: power/limit, temperature, memory, SM clock and throttle reasons; bottom: the processes"),
    ("vLLM card", "running and waiting requests, KV cache use and generated tokens/s on the GPU cards' time axis; "
                  "right: the chart's scale, prompt tokens/s, preemptions/s, /metrics latency; then TTFT, "
                  "inter-token and end-to-end latency (p50/p95/p99, last minute) and how requests finished; "
                  "before vtop started: from the log, another shade (┊ a restart)"),
    ("requests line", "requests in flight (vLLM's running + waiting), the oldest named with how long it has run "
                      "at least and the max_tokens vLLM filled in; without end lines in the log, the requests it "
                      "received in the last 10 s (r: every request known in flight, by the request log, its "
                      "connection or /metrics)"),
    ("startup", "the phases of a vllm serve start, how long each took, progress, and a possible hang"),
    ("log", "the vLLM log's last lines (its own time stamps); w: warnings only; /: a filter"),
)


class HelpScreen(ModalScreen[None]):
    """``?`` or F1: every key of this screen and what the rows mean."""

    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def __init__(self, keys: list[tuple[str, str, bool]], notes: list[str]) -> None:
        super().__init__()
        self.keys = keys
        """(key as shown, what it does, on) for every key."""
        self.notes = notes

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="-full"):
            yield Label("vtop help", id="dialog-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(self.help_text(), id="help")
            yield Label("esc/? close · ↑↓ scroll", id="dialog-keys")

    def help_text(self) -> Text:
        out = Text()
        out.append("Keys\n", style="bold")
        w = max((len(k) for k, _, _ in self.keys), default=1)
        for key, what, on in self.keys:
            out.append(f"  {key:<{w}}  ", style="bold" if on else "dim")
            out.append(what + ("" if on else " (off here)") + "\n", style="" if on else "dim")
        for note in self.notes:
            out.append(f"\n{note}\n", style="bold")
        out.append("\nThe screen\n", style="bold")
        for name, what in ROWS_HELP:
            out.append(f"  {name}: ", style="bold")
            out.append(what + "\n")
        out.append("\nMissing data is a gap (n/a, -), never a zero.\n", style="dim")
        return out


def process_rows(monitor: Any, info: dict[int, Any], sort: str = "gpu_mem") -> list[tuple[str, ...]]:
    """The process view's rows: each vLLM server's processes folded together under a
    header row (API server, EngineCore, workers), then the other GPU processes; groups and
    the processes in them sorted by ``sort`` (gpu_mem, cpu or pid), largest first."""
    gib = 2**30
    gpu_of: dict[int, list[tuple[int, int | None]]] = {}
    sm_of: dict[int, list[float]] = {}
    poll = monitor.gpu_history.last_poll
    for g in (poll.gpus if poll is not None else ()):
        for p in g.procs or ():
            gpu_of.setdefault(p.pid, []).append((g.index, p.used_bytes))
            if p.sm_util is not None:
                sm_of.setdefault(p.pid, []).append(p.sm_util)

    def gpu_mem(pid: int) -> float:
        return sum(b or 0 for _, b in gpu_of.get(pid, ()))

    def key(pid: int) -> float:
        i = info.get(pid)
        if sort == "cpu":
            return (i.cpu_pct or 0.0) if i else 0.0
        if sort == "pid":
            return -pid
        return gpu_mem(pid)

    def row(pid: int, role: str, server: str) -> tuple[str, ...]:
        i = info.get(pid)
        gpus = ",".join(str(ix) for ix, _ in gpu_of.get(pid, ()))
        mem = gpu_mem(pid)
        sm = sm_of.get(pid)
        return (str(pid), role, server, gpus or "-", f"{mem / gib:.1f} GiB" if pid in gpu_of else "-",
                "-" if sm is None else ",".join(f"{v:.0f}" for v in sm),
                "-" if i is None or i.cpu_pct is None else f"{i.cpu_pct:.0f}",
                "-" if i is None or i.rss_bytes is None else f"{i.rss_bytes / gib:.1f} GiB",
                (i.user if i and i.user else "-"), ((i.command or "-")[:200] if i else "-"))

    groups: list[tuple[float, list[tuple[str, ...]]]] = []
    seen: set[int] = set()
    for url, ws in monitor.servers.items():
        sp = ws.process
        if sp is None:
            continue
        port = url.rsplit(":", 1)[-1]
        members = [(sp.pid, "API server")] + [(c.pid, c.title.split("::", 1)[-1] if "::" in c.title else c.role)
                                                for c in sp.children]
        seen.update(pid for pid, _ in members)
        members.sort(key=lambda m: key(m[0]), reverse=True)
        total = sum(gpu_mem(pid) for pid, _ in members)
        where = f" · {sp.placement}" if sp.placement else ""
        head = (f"{flags_of(sp.engine)['name']} :{port}", f"{len(members)} processes{where}", url, "", f"{total / gib:.1f} GiB", "", "", "",
                "", "")
        ns = {sp.pid: sp.ns_pid, **{c.pid: c.ns_pid for c in sp.children}}
        rows = []
        for pid, role in members:
            r = row(pid, "  " + role, f":{port}")
            if ns.get(pid) is not None:  # the PID its log and its container know it by
                r = (f"{pid} ({ns[pid]})",) + r[1:]
            rows.append(r)
        groups.append((max(key(pid) for pid, _ in members) if sort != "gpu_mem" else total, [head] + rows))
    for pid in gpu_of:
        if pid not in seen:
            groups.append((key(pid), [row(pid, monitor.gpu_owner.get(pid) or monitor.proc_names.get(pid, ""), "-")]))
    groups.sort(key=lambda g: g[0], reverse=True)
    return [r for _, rows in groups for r in rows]


class ProcessScreen(ModalScreen[None]):
    """``P``: the GPU processes and every vLLM server's processes (API server, EngineCore,
    workers) folded together; ``m``/``c``/``i`` sort by GPU memory, CPU, PID. Refreshed
    once a second (CPU % is measured between refreshes)."""

    BINDINGS = [
        Binding("escape,q,P", "dismiss", "Close"),
        Binding("m", "sort('gpu_mem')", "Sort GPU mem"),
        Binding("c", "sort('cpu')", "Sort CPU"),
        Binding("i", "sort('pid')", "Sort PID"),
    ]
    #: "SM %": the process's share of its GPU's SM time since the read before (NVML's per-process
    #: samples, read every 4 s while processes share a GPU, every 30 s for one alone; "-" where the
    #: driver gives none)
    COLUMNS = ("PID", "role", "server", "GPU", "GPU mem", "SM %", "CPU %", "host mem", "user", "command")

    def __init__(self, monitor: Any, *, live: bool = True) -> None:
        super().__init__()
        from vtop.sources.proctable import ProcTable

        self.monitor = monitor
        self.table = ProcTable() if live else None
        """None in a replay: the recorded pids are not this box's processes."""
        self.sort = "gpu_mem"

    def compose(self) -> ComposeResult:
        from textual.widgets import DataTable

        with Vertical(id="dialog", classes="-full"):
            yield Label("Processes: on the GPUs, and each vLLM server's tree folded together", id="dialog-title")
            yield DataTable(id="proc-table", cursor_type="row")
            yield Label("esc close · sort: m GPU memory · c CPU · i PID", id="dialog-keys")

    def on_mount(self) -> None:
        from textual.widgets import DataTable

        self.query_one("#proc-table", DataTable).add_columns(*self.COLUMNS)
        self.refresh_rows()
        self.set_interval(1.0, self.refresh_rows)

    def pids(self) -> set[int]:
        out: set[int] = set()
        poll = self.monitor.gpu_history.last_poll
        for g in (poll.gpus if poll is not None else ()):
            out.update(p.pid for p in g.procs or ())
        for ws in self.monitor.servers.values():
            if ws.process is not None:
                out.add(ws.process.pid)
                out.update(c.pid for c in ws.process.children)
        return out

    def refresh_rows(self) -> None:
        from textual.widgets import DataTable

        t = self.query_one("#proc-table", DataTable)
        info = self.table.read(self.pids()) if self.table is not None else {}
        rows = process_rows(self.monitor, info, self.sort)
        t.clear()
        for r in rows:
            t.add_row(*r)
        if not rows:
            t.add_row("-", "no GPU process and no vLLM server process seen", *[""] * 7)

    def action_sort(self, by: str) -> None:
        self.sort = by
        self.refresh_rows()
