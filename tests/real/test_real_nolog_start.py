"""A start that fails while vtop cannot read its log, for real: the real vLLM CPU build writing to a pipe
(as under a supervisor, or ``vllm serve ... | cat``), asked for ``--max-model-len 4096`` on the tiny model's
2048 positions (config validation fails in the API server, the server exits: the corpus's
``startup-failure-bad-max-model-len``, whose log vtop read). vtop, watching from before the launch with no
``--log``, finds no file to follow and names the failure from the processes: seen while the port refused,
gone before it ever answered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.real import shot, until
from tests.helpers.screen_text import screen_text
from tests.real.conftest import MODEL_DIR, RealVllm
from vtop.config import Config
from vtop.ui.app import VtopApp

pytestmark = pytest.mark.real


async def test_a_start_that_fails_on_a_pipe_is_named_from_its_processes(tmp_path: Path) -> None:
    srv = RealVllm(tmp_path)
    app = VtopApp(Config(urls=(srv.url,), no_gpu=True, interval=0.5), hostname="cpu-box")
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(1.0)
            # the tiny model's own folder (2048 positions) asked for 4096: vLLM refuses the config
            srv.launch(max_model_len=4096, model=str(MODEL_DIR), output="pipe")
            m = app.monitor
            ws = m.servers[srv.url]

            def state() -> str | None:
                return ws.last_view.state if ws.last_view is not None else None

            await until(pilot, lambda: state() == "starting", 120, "the card to say STARTING (the process seen)")
            assert m.log_watch is None, "vtop followed a log: the server's output was to be a pipe"

            def failure() -> Any:
                return next((a for a in m.alerts if a.rule == "startup_failure"), None)

            await until(pilot, lambda: failure() is not None, 180, "the start failure to be named")
            assert srv.proc is not None and srv.proc.poll() is not None, "named while the server still ran"
            out = srv.log_text()
            assert "max_model_len" in out or "max-model-len" in out, out[-2000:]  # it failed for the config
            a = failure()
            assert a.severity == "critical" and a.target == srv.url
            assert "exited while starting" in a.title and "no log: the error is in its output" in a.title, a.title
            assert any(f"process {srv.starts[-1].pid} was seen starting" in e for e in a.evidence), a.evidence
            await pilot.pause(1.0)
            shot(app, "startup-failure-nolog-cpu.svg")
            text = screen_text(app)
            assert "exited while starting" in text, text
    finally:
        srv.stop()
