"""The keys that act on the box: ``s`` (an incident bundle), ``d`` (a py-spy dump), ``t`` (a test
request); which keys are on (``--readonly`` dims the three; a replay hides them: they would act on this
box, not the recorded one). A mixin of :class:`vtop.ui.app.VtopApp`.

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

        @property
        def log_watch(self) -> LogWatch | None: ...

        @property
        def log_view(self) -> LogView | None: ...

        @property
        def alerts(self) -> list[Alert]: ...

        def update_status(self) -> None: ...

    ACTION_KEYS = ("snapshot", "pyspy", "test_request")

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
                what = {"snapshot": "snapshot", "pyspy": "py-spy dump", "test_request": "test request"}[b.action]
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
            timeline=tl.lines() if tl is not None else (),
            timeline_json=tl.to_json() if tl is not None else None,
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
                                     client=self.action_client, api_key=self.monitor.api_key_for(e.url),
                                     userinfo=self.config.credentials_for(e.url)))
