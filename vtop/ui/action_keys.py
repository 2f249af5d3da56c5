"""The keys that act on the box: ``s`` (an incident bundle), ``d`` (a py-spy dump), ``t`` (a test
request), ``x`` (stop one request: the runaway alert's, or the one picked in ``r``); which keys are on
(``--readonly`` dims the four; a replay hides them: they would act on this box, not the recorded one).
A mixin of :class:`vtop.ui.app.VtopApp`.

``x`` closes the request's connection in a thread with a deadline (:mod:`vtop.actions.stop`), then
watches the monitor's answers for vLLM's abort, and says stopped / did not work; every stop is kept
for the next bundle (``actions.json``).

The bundle scrapes each server's ``/metrics`` afresh (through the live feed's HTTP pool, 3 s each) so
that it holds the text as it was when ``s`` was pressed, and writes in a thread
(:class:`vtop.actions.snapshot.SnapshotRunner`), its progress in the status line.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any, Literal

from textual import work
from textual.app import App
from textual.binding import Binding

if TYPE_CHECKING:
    from vtop.config import Config
    from vtop.core.rules import Alert
    from vtop.monitor import Monitor
    from vtop.monitor.live import LiveFeed
    from vtop.monitor.logwatch import LogView, LogWatch
    from vtop.monitor.player import Player


class ActionKeys(App[int]):
    if TYPE_CHECKING:  # the app's (vtop.ui.app.VtopApp)
        config: Config
        monitor: Monitor
        feed: LiveFeed | None
        replay: Player | None
        last_snapshot: Any
        _snapshots: Any
        _snapshot_busy: bool
        _snap_pct: int
        _snap_text: str
        _action_client: Any
        _stops: list[Any]

        @property
        def log_watch(self) -> LogWatch | None: ...

        @property
        def log_view(self) -> LogView | None: ...

        @property
        def alerts(self) -> list[Alert]: ...

        def update_status(self) -> None: ...

    ACTION_KEYS = ("snapshot", "pyspy", "test_request", "stop_request")
    #: seconds ``x`` waits for vLLM to show the abort after the close (:data:`vtop.actions.stop.WAIT_S`)
    stop_wait_s = 15.0
    #: each action key's name in the READ-ONLY note
    ACTION_WORDS = {"snapshot": "snapshot", "pyspy": "py-spy dump", "test_request": "test request",
                    "stop_request": "stop a request"}

    @property
    def snapshots(self) -> Any:
        """The snapshot runner (``s``), made when first used."""
        if self._snapshots is None:
            from vtop.actions.snapshot import SnapshotRunner

            self._snapshots = SnapshotRunner()
        return self._snapshots

    @property
    def action_client(self) -> Any:
        """The HTTP pool of the test request (a streamed POST): the scrapes' own pool
        (:class:`vtop.sources.http11.HttpPool`: no proxies, no redirects), or one of its
        own in a replay, made the first time a key needs it."""
        if self.feed is not None:
            return self.feed.client
        if self._action_client is None:
            from vtop.sources.http11 import HttpPool

            self._action_client = HttpPool()
        return self._action_client

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """--readonly: the action keys show dimmed in the footer and do nothing.
        A replay hides them: they would act on this box, not the recorded one."""
        if action in self.ACTION_KEYS and self.replay is not None:
            return False
        if action in self.ACTION_KEYS and self.config.readonly:
            return None
        if action.startswith("replay_") and getattr(self.focused, "id", None) == "log-filter":
            return False  # typing the log filter: space and the arrows are the text's
        if action == "timeline":
            return self.monitor.has_past()  # offered when the log tells of the time before vtop
        if action in ("freeze", "poll_interval") and self.feed is None and self.replay is None:
            return None  # driven by hand (tests): nothing polls
        return True

    def on_key(self, event: Any) -> None:
        """--readonly (``vtop web`` without ``--allow-actions``): an action key does nothing (its
        binding is disabled, so the key reaches here unhandled); say so rather than stay silent."""
        if not self.config.readonly or self.replay is not None:
            return
        for b in self.BINDINGS:
            if isinstance(b, Binding) and b.action in self.ACTION_KEYS and event.key in b.key.split(","):
                what = self.ACTION_WORDS[b.action]
                self.notify(f"READ-ONLY: {b.key} ({what}) is off here (--readonly; "
                            "vtop web turns it on with --allow-actions)", severity="warning")
                event.stop()
                return

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
        from vtop.core.phases.tracker import summarize
        from vtop.model.redact import basic_auth
        from vtop.sources.logtail import LogTailer
        from vtop.sources.vllm import MAX_BODY_BYTES

        metrics: dict[str, bytes | None] = {}
        for url in self.monitor.servers:
            try:
                assert self.feed is not None  # the action keys are off in a replay
                headers = [("Accept-Encoding", "identity")]
                if (userinfo := self.config.credentials_for(url)) is not None:
                    headers.append(("Authorization", basic_auth(userinfo)))
                _, body = await asyncio.wait_for(
                    self.feed.client.get(url + "/metrics", headers=headers, limit=MAX_BODY_BYTES), 3.0)
                metrics[url] = body
            except Exception:  # the bundle says the server gave nothing
                metrics[url] = None
        src = getattr(self.log_watch, "source", None)
        log_path = src.path if isinstance(src, LogTailer) else None
        phases = dict(summarize(self.log_view.snapshot)) | self.monitor.startup_extras() if self.log_view else None
        tl = self.monitor.timeline()
        secrets = [k for k in (self.config.api_key, os.environ.get("VLLM_API_KEY")) if k]
        secrets += [cred.partition(":")[2] for _, cred in self.config.url_auth]  # a URL's password
        fut = self.snapshots.start(
            self.config.snapshot_dir,
            log_path=log_path,
            servers=[ws.process for ws in self.monitor.servers.values() if ws.process is not None],
            metrics_texts=metrics,
            history_json=self.monitor.history_json(),
            phases_json=phases,
            alerts=[a.to_json() for a in self.alerts],
            screen_svg=self.export_screenshot(),
            actions=[rec.to_json() for rec in self._stops],
            timeline=tl.lines() if tl is not None else (),
            timeline_json=tl.to_json() if tl is not None else None,
            redact_prompts=self.config.redact_prompts,
            secrets=secrets,
            progress=self._snapshot_progress_from_thread,
        )
        kept = list(self._stops)
        res = await asyncio.wrap_future(fut)
        self.last_snapshot = res
        if res.path is not None:  # written: the next bundle holds the stops after these
            self._stops = [rec for rec in self._stops if rec not in kept or rec.stopped is None]
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
                                     client=self.action_client, api_key=self.monitor.api_key_for(e.url),
                                     userinfo=self.config.credentials_for(e.url)))

    # ------------------------------------------------------------------ x: stop one request
    def action_stop_request(self) -> None:
        """``x`` on the dashboard: the request the runaway alert names (the oldest in flight on its server whose
        answer has not gone silent: :attr:`~vtop.model.requests.ServerRequests.answering`)."""
        alert = next((a for a in self.alerts if a.rule == "runaway" and a.target), None)
        if alert is None or alert.target is None:
            self.notify("stop: no runaway alert now; open r (requests) and press x on the request to stop",
                        severity="warning")
            return
        answer = self.monitor.in_flight.get(alert.target)
        r = answer.answering if answer is not None else None
        if r is None:
            self.notify("stop: the runaway alert names no request in flight now", severity="warning")
            return
        self.open_stop(alert.target, r)

    def open_stop(self, url: str, r: Any) -> None:
        """The confirmation of stopping ``r`` (an :class:`~vtop.model.requests.InFlightRequest`) on ``url``;
        from ``x`` on the dashboard and in ``r``. Off under --readonly and in a replay (said)."""
        from vtop.actions.stop import missing_privilege, target_for
        from vtop.sources.urls import LOCAL_HOSTS, url_hostport
        from vtop.ui.screens import StopScreen

        if self.replay is not None:
            self.notify("stop: a replay acts on nothing (the request was on the recorded box)", severity="warning")
            return
        if self.config.readonly:
            self.notify("READ-ONLY: x (stop a request) is off here (--readonly; vtop web turns it on with "
                        "--allow-actions)", severity="warning")
            return
        ws = self.monitor.servers.get(url)
        got = target_for(url, ws.process if ws is not None else None, r,
                         local=url_hostport(url)[0] in LOCAL_HOSTS)
        target = got if not isinstance(got, str) else None
        why = got if isinstance(got, str) else missing_privilege(netns=got.netns_pid is not None)
        self.push_screen(StopScreen(url, r, target, why, self.start_stop))

    def observe_stop(self, url: str, request_id: str | None, after_s: float) -> Any:
        """What vLLM shows now of the server (the monitor's latest answer: running, its abort counter,
        the request log's abort line)."""
        from vtop.actions.stop import Observation
        from vtop.sources.metrics_text import FINISH_ANY_REASON

        answer = self.monitor.in_flight.get(url)
        ws = self.monitor.servers.get(url)
        m = ws.last_view.metrics if ws is not None and ws.last_view is not None else None
        running = answer.running if answer is not None else (m.running if m is not None else None)
        waiting = answer.waiting if answer is not None else (m.waiting if m is not None else None)
        fin = getattr(m, "request_success_total", None) if m is not None else None
        # an engine that counts its finishes without a reason (SGLang: FINISH_ANY_REASON) counts no aborts
        aborts = None if not fin or FINISH_ANY_REASON in fin else float(fin.get("abort", 0.0))
        finished = float(sum(fin.values())) if fin else None
        logged = None
        lv = self.log_view
        if request_id and lv is not None and self.monitor.log_target == url:
            logged = any(f.request_id == request_id and f.reason == "aborted" for f in lv.recent_finished)
        return Observation(after_s, running, aborts, logged, waiting, finished)

    def start_stop(self, target: Any, show: Any) -> None:
        """Confirmed: close the connection (a thread, with a deadline) and watch for the abort; ``show(line,
        stopped)`` gets each result line. Runs on the app, so closing the screen does not stop it."""
        self.run_worker(self._stop_flow(target, show), group="stop", exit_on_error=False)

    async def _close_answer(self, fut: Any, client: str, show: Any) -> Any:
        """The close's answer (a :class:`~vtop.actions.stop.CloseResult`) from its thread's future. The close
        bounds each of its waits for the kernel itself; on a loaded box its thread may get the CPU seconds late,
        so the face waits for the answer (said after ``CLOSE_ANSWER_S``) and gives up only after
        ``CLOSE_GIVE_UP_S``: then whether the connection closed is not known (the close may still run)."""
        import time

        from vtop.actions import stop

        t0 = time.monotonic()
        waiting = asyncio.wrap_future(fut)
        step = stop.CLOSE_ANSWER_S
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=step)
            if done:
                return waiting.result()
            waited = time.monotonic() - t0
            if waited >= stop.CLOSE_GIVE_UP_S:
                waiting.cancel()  # an answer that comes after is dropped quietly (start_close)
                return stop.CloseResult(False, f"the close had not answered after {waited:.0f} s: whether the "
                                        "connection closed is not known", elapsed_s=waited, unknown=True)
            show(f"closing the connection from {client}: no answer from the close after {waited:.0f} s (on a "
                 "loaded box its thread waits for the CPU); still waiting", None)
            step = min(1.0, stop.CLOSE_GIVE_UP_S - waited)

    async def _stop_flow(self, target: Any, show: Any) -> None:
        import time

        from vtop.actions.stop import StopRecord, start_close, verdict

        t0 = time.monotonic()
        rid = target.request.request_id
        before = self.observe_stop(target.server, rid, 0.0)
        rec = StopRecord.of(target, time.time())
        self._stops.append(rec)
        res = await self._close_answer(start_close(target), target.client, show)
        rec.close_s = round(res.elapsed_s, 3)
        prev = None
        while True:
            now = self.observe_stop(target.server, rid, time.monotonic() - t0)
            final, stopped, line = verdict(res, before, now, prev, wait_s=self.stop_wait_s)
            show(line, stopped if final else None)
            if final:
                break
            if prev is None or (now.busy, now.finished) != (prev.busy, prev.finished):
                prev = now  # the poll before the next one that moved
            await asyncio.sleep(0.25)
        rec.result, rec.stopped = line, stopped
        rec.seconds_to_abort = round(now.after_s, 2) if stopped else None
        rec.extra = {"running_before": before.running, "running_after": now.running, "waiting_before": before.waiting,
                     "waiting_after": now.waiting, "finished_since": None if now.finished is None or
                     before.finished is None else now.finished - before.finished}
        self.notify(("" if stopped else "stop: ") + line, severity="information" if stopped else "error", timeout=15)
        say = getattr(self, "say", None)
        if say is not None:
            say(line, 30.0)
