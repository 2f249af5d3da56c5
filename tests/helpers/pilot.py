"""Waiting on a running app under Textual's Pilot: for an event, never for a duration
(``GUARD_S`` only stops a hang and never decides a healthy run)."""

from __future__ import annotations

import asyncio

from vtop.ui.app import VtopApp

GUARD_S = 30.0  # hang guard only: a healthy run, however loaded the box, never gets near it


async def wait_for(pilot, cond, timeout: float = GUARD_S) -> None:  # type: ignore[no-untyped-def]
    """Wait for ``cond()`` (an event, not a duration); ``timeout`` is a hang guard only."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"hang guard: still waiting after {timeout:.0f} s")
        await pilot.pause(0.05)


def polled(app: VtopApp, url: str) -> bool:
    """The dashboard has read the server once (its model name and max_model_len with it)."""
    e = app.monitor.servers.get(url)
    return e is not None and e.last_view is not None and bool(e.last_view.model_id)


async def log_pane_settled(pilot, app: VtopApp) -> None:  # type: ignore[no-untyped-def]
    """Before the app closes: the log pane shows the log and its line-width thread worker
    (Textual's Log) is done. Closing the app under that worker fails the app with
    NoActiveAppError, a race on exit that a loaded box hits when a test ends quickly."""
    from textual.widgets import Log

    await wait_for(pilot, lambda: app.w_log.line_count > 0
                   and not any(isinstance(w.node, Log) and not w.is_finished for w in app.workers))
