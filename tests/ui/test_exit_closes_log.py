"""An exit without q (SIGTERM, a test's end) lets go of the followed log: a journal's `journalctl -f`
child outlived vtop (seen after the real journald test), a file stayed open."""

from __future__ import annotations

from pathlib import Path

from vtop.config import Config
from vtop.ui.app import VtopApp


async def test_the_followed_log_is_closed_when_the_app_goes(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("INFO 12-04 10:00:00 [api_server.py:1] vLLM API server version 0.26.0\n")
    app = VtopApp(Config(no_gpu=True, urls=("http://127.0.0.1:9",), log=str(log)), hostname="t")
    closed: list[bool] = []
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        lw = app.monitor.log_watch
        assert lw is not None
        real_close = lw.source.close

        def close() -> None:
            closed.append(True)
            real_close()
        lw.source.close = close  # type: ignore[method-assign]
    assert closed, "the log source was not closed at exit"
