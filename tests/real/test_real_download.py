"""Issue 40, first bullet, for real: the real vLLM CPU server fetching its weights from a Hub.

The Hub is tests/helpers/fake_hub.py on loopback (``HF_ENDPOINT``): the tiny model as a two-shard
repo with an index, shard 2 padded with one tensor vLLM's Llama loader drops by name, the CDN's
bytes throttled so the download takes about 30 s. huggingface_hub writes a download in 10 MiB
chunks (``DOWNLOAD_CHUNK_SIZE``: the ``.incomplete`` file grows by 10 MiB steps), so the bytes on
disk trail the bytes served by up to 10 MiB: progress is compared with the bytes served at the
moment of each scan once 120 MB are out (10 MiB is under 10 % of that).

Asserted: vtop's bytes within 10 % of the bytes served, an ETA on the startup panel and in
``vtop --once --json``; then the Hub paused mid-file (the connection open, no byte) and the stall
named as ``startup_stall`` in downloading (threshold 20 s here, 60 s by default), with its fix.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.fake_hub import FakeHub, padded_model
from tests.helpers.real import app_for, shot, until
from tests.real.conftest import MODEL_DIR
from vtop.core.rules import Diagnoser, Thresholds
from vtop.ui.widgets.startup_panel import StartupPanel

pytestmark = pytest.mark.real

REPO = "vtop-test/tiny-padded"
PAD = 300_000_000
RATE = 10_000_000  # bytes/s per connection: 300 MB in about 30 s
STALL_S = 20.0


@pytest.mark.vllm_own_start  # launches its own server (the Hub repo) and stops it
async def test_download_progress_eta_and_stall(real_vllm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = real_vllm
    files = padded_model(MODEL_DIR, tmp_path / "repo", PAD)
    total_files = sum(p.stat().st_size for n, p in files.items() if n.endswith(".safetensors"))
    with FakeHub(REPO, files, rate_bps=RATE) as hub:
        srv.launch(model=REPO, env={
            "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0",
            "TRANSFORMERS_OFFLINE": "0", "HF_HUB_DOWNLOAD_TIMEOUT": "600", "HF_HUB_DISABLE_TELEMETRY": "1",
        })
        app = app_for(srv, tmp_path, "download")
        app.monitor.diagnoser = Diagnoser(Thresholds(download_stall_s=STALL_S))
        async with app.run_test(size=(120, 40)) as pilot:
            m = app.monitor
            await until(pilot, lambda: (p := m.download_progress()) is not None and p.done > 0, 240,
                         "the download in the Hub cache")
            samples: list[tuple[int, int, float | None]] = []
            seen: float | None = None
            panel_text = ""
            while hub.served < 0.6 * total_files:
                scan = m.download.last_scan
                p = m.download_progress()
                if scan is not None and p is not None and scan.mono != seen:
                    seen = scan.mono
                    samples.append((p.done, hub.served_at(scan.mono), p.eta_s))
                    if p.eta_s is not None and "left" in (t := app.query_one(StartupPanel).build().plain):
                        panel_text = t
                await pilot.pause(0.2)
                assert srv.is_running(), srv.log_tail()
            # --once --json in the middle of the download
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "vtop", "--once", "--json", "--window", "6s", srv.url,
                "--log", str(srv.log_path), "--no-gpu", stdout=asyncio.subprocess.PIPE)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            shot(app, "startup-cpu-real-download.svg")
            hub.pause()
            paused_at = time.monotonic()
            rep = json.loads(out)
            dl = rep["startup"]["download"]
            assert dl is not None and dl["repo"] == REPO and dl["cache_from"] == "environ", dl
            assert dl["total_bytes"] is not None and abs(dl["total_bytes"] - total_files) < 0.01 * total_files
            assert 0 < dl["done_bytes"] <= hub.served
            assert dl["eta_s"] is not None and "left" in dl["text"], dl
            # progress within 10 % of the bytes served (at each scan's moment), once 120 MB are out
            judged = [(d, s) for d, s, _ in samples if s >= 120_000_000]
            assert len(judged) >= 3, samples
            for done, served in judged:
                assert abs(done - served) <= 0.10 * served, (done, served, samples)
            assert any(eta is not None for *_, eta in samples)
            assert "downloading" in panel_text and "left" in panel_text, panel_text
            # the Hub paused mid-file: no byte comes; the stall named within the threshold and a few scans
            await until(pilot, lambda: any(a.rule == "startup_stall" and "downloading" in a.title
                                            for a in app.alerts), STALL_S + 20, "the download stall named")
            took = time.monotonic() - paused_at
            a = next(a for a in app.alerts if a.rule == "startup_stall")
            assert REPO in a.title and took >= STALL_S - 3, (a.title, took)
            text = " ".join((a.title, *a.evidence, *a.fix))
            assert "HF_HUB_ENABLE_HF_TRANSFER" in text and "HF_HUB_OFFLINE=1" in text and ".incomplete" in text
            shot(app, "alerts-cpu-real-download-stall.svg")
            print(f"samples (vtop bytes, bytes served, eta): {samples}; stall named {took:.1f} s after the pause")
            print(f"alert: {a.title}; the --once text: {dl['text']}")
            hub.resume()
            await until(pilot, lambda: not any(a.rule == "startup_stall" for a in app.alerts), 60,
                         "the stall to clear once bytes come again")
        srv.stop()
