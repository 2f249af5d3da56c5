"""Issue 40, first bullet: a start's Hub download (bytes, rate, ETA, the stall), on an injected clock
and a real cache folder laid out as huggingface_hub lays it out (blobs, *.incomplete, snapshot links)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from vtop.core.download import DownloadTracker
from vtop.core.evidence import Evidence, LogEvidence
from vtop.core.phases.types import Phase, StallInfo
from vtop.core.rules import Diagnoser, Thresholds
from vtop.model.download import CacheScan
from vtop.sources.hfcache import HubCacheScanner, hub_cache_dir, is_repo_id, read_environ

REPO = "acme/tiny"
URL = "http://127.0.0.1:8000"
GB = 10**9


def _scan(t: float, inflight: int, complete: int = 0, total: int | None = 16_100_000_000) -> CacheScan:
    return CacheScan(t, REPO, "/c", "environ", {"abc.incomplete": inflight} if inflight >= 0 else {},
                     complete, 1 if complete else 0, total, 4 if total else None, repo_seen=True)


def test_rate_eta_and_text_from_scans() -> None:
    tr = DownloadTracker(window_s=10.0)
    for i in range(11):  # 48 MB/s for 10 s on top of 6.62 GB already there
        tr.add(_scan(100.0 + i, 1_000_000_000 + 48_000_000 * i, complete=5_620_000_000))
    p = tr.progress(110.0)
    assert p is not None
    assert p.done == 5_620_000_000 + 1_480_000_000
    assert p.rate_bps is not None and abs(p.rate_bps - 48e6) < 1
    assert p.rate_window_s == 10.0
    assert p.eta_s is not None and abs(p.eta_s - (16.1e9 - 7.1e9) / 48e6) < 1
    assert p.text() == "downloading 7.1 of 16.1 GB, 48.0 MB/s over 10 s, about 3 min left"
    assert p.quiet_s == 0.0 and p.active == 1 and not p.finished
    j = p.to_json()
    assert j["done_bytes"] == p.done and j["total_bytes"] == 16_100_000_000 and j["eta_s"] == round(p.eta_s, 1)


def test_no_index_no_total_no_eta_and_quiet_counts_from_last_byte() -> None:
    tr = DownloadTracker()
    tr.add(_scan(0.0, 100, total=None))
    tr.add(_scan(2.0, 200, total=None))
    for t in (4.0, 30.0, 70.0):
        tr.add(_scan(t, 200, total=None))
    p = tr.progress(71.0)
    assert p is not None and p.total is None and p.eta_s is None
    assert p.quiet_s == 69.0  # the last byte came at t=2
    assert "total unknown" in p.text()


def test_stall_named_past_threshold_and_silence_rules_kept_quiet_while_bytes_move() -> None:
    tr = DownloadTracker()
    tr.add(_scan(0.0, 100))
    tr.add(_scan(2.0, 5000))
    d = Diagnoser(Thresholds(download_stall_s=60.0))
    tr.add(_scan(50.0, 5000))
    early = d.update(Evidence(50.0, log=LogEvidence(URL), download=tr.progress(50.0)))
    assert not [a for a in early if a.rule == "startup_stall"]
    tr.add(_scan(63.0, 5000))
    late = d.update(Evidence(63.0, log=LogEvidence(URL), download=tr.progress(63.0)))
    stall = [a for a in late if a.rule == "startup_stall"]
    assert len(stall) == 1 and "downloading acme/tiny" in stall[0].title and "1m 01s" in stall[0].title
    assert any("HF_HUB_ENABLE_HF_TRANSFER" in f for f in stall[0].fix)
    assert any("HF_HUB_OFFLINE=1" in f for f in stall[0].fix)
    # the 10-minute ceiling of a silent log: a download whose bytes move is no hang
    ceiling = StallInfo(Phase.WEIGHTS, 700.0, "Starting to load model acme/tiny...", "hint")
    tr2 = DownloadTracker()
    tr2.add(_scan(0.0, 100))
    tr2.add(_scan(2.0, 5000))
    moving = Diagnoser().update(Evidence(2.0, log=LogEvidence(URL, stall=ceiling), download=tr2.progress(2.0)))
    assert not [a for a in moving if a.rule == "startup_stall"]
    alone = Diagnoser().update(Evidence(2.0, log=LogEvidence(URL, stall=ceiling)))
    assert [a.title for a in alone if a.rule == "startup_stall"]


def test_finished_download_is_not_in_flight() -> None:
    tr = DownloadTracker()
    s = CacheScan(5.0, REPO, "/c", "default", {}, 4000, 4, 3900, 4, repo_seen=True)
    tr.add(s)
    p = tr.progress()
    assert p is not None and p.finished and p.active == 0 and p.total == 4000  # never below done
    assert p.text().startswith("downloaded 4.0 of 4.0 KB")


def test_cache_dir_follows_the_process_environment() -> None:
    assert hub_cache_dir({"HF_HUB_CACHE": "/x/hub", "HF_HOME": "/y"}) == ("/x/hub", "environ")
    assert hub_cache_dir({"HF_HOME": "/y"}) == ("/y/hub", "environ")
    assert hub_cache_dir({"HOME": "/home/u"}) == ("/home/u/.cache/huggingface/hub", "environ")
    assert hub_cache_dir({"HOME": "/h", "XDG_CACHE_HOME": "/xdg"}) == ("/xdg/huggingface/hub", "environ")
    assert hub_cache_dir(None)[1] == "default"
    env = read_environ(os.getpid())
    assert env is not None and env.get("PATH") == os.environ.get("PATH")
    assert read_environ(2**22 + 12345) is None
    assert is_repo_id("meta-llama/Llama-3.1-8B") and not is_repo_id("/models/llama") and not is_repo_id("a/b/c")


def test_scan_of_a_real_cache_layout(tmp_path: Path) -> None:
    repo = tmp_path / "models--acme--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / "e1").write_bytes(b"x" * 3000)
    (snap / "model-00001-of-00002.safetensors").symlink_to("../../blobs/e1")
    (blobs / "e2.incomplete").write_bytes(b"y" * 1234)
    (blobs / "e3").write_bytes(b"{}" * 10)
    (snap / "config.json").symlink_to("../../blobs/e3")  # not a weight file: not counted
    idx = {"metadata": {"total_size": 6000}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                           "b": "model-00002-of-00002.safetensors"}}
    (snap / "model.safetensors.index.json").write_text(json.dumps(idx))
    env_pid = None  # vtop's own environment: point HF_HUB_CACHE at tmp_path for this scan
    old = os.environ.get("HF_HUB_CACHE")
    os.environ["HF_HUB_CACHE"] = str(tmp_path)
    try:
        s = HubCacheScanner().scan(env_pid, REPO, mono=1.0)
    finally:
        if old is None:
            del os.environ["HF_HUB_CACHE"]
        else:
            os.environ["HF_HUB_CACHE"] = old
    assert s.repo_seen and s.cache_from == "default" and s.cache_dir == str(tmp_path)
    assert s.incomplete == {"e2.incomplete": 1234}
    assert s.complete_bytes == 3000 and s.complete_files == 1
    assert s.index_total == 6000 and s.index_files == 2
    assert s.done == 4234
    missing = HubCacheScanner().scan(None, "acme/other", mono=1.0)
    assert not missing.repo_seen and missing.error is not None


def test_the_download_thread_sleeps_while_no_start_downloads_and_wakes_when_one_does(monkeypatch) -> None:
    """No download to scan: the thread looks every DOWNLOAD_IDLE_S, not every 2 s; the tick a start's
    download phase appears it is poked (scanned at once), then scans every DOWNLOAD_EVERY_S."""
    import asyncio

    from vtop.config import Config
    from vtop.monitor import Monitor
    from vtop.monitor.live import LiveFeed

    m = Monitor(Config(no_gpu=True), find_logs=False)
    target: list[tuple[int | None, str] | None] = [None]
    monkeypatch.setattr(m, "download_target", lambda: target[0])
    scanned: list[tuple[int | None, str]] = []

    async def run() -> None:
        feed = LiveFeed(m, gpu_source=None, discover=None)
        monkeypatch.setattr(feed, "download_blocking",
                            lambda: scanned.append(feed._download_target) if feed._download_target else None)
        feed.start()
        try:
            loop = feed.download_loop
            assert loop is not None
            pokes: list[float] = []
            real_poke = loop.poke
            monkeypatch.setattr(loop, "poke", lambda: (pokes.append(loop.interval), real_poke()))
            feed.collect()
            assert loop.interval == LiveFeed.DOWNLOAD_IDLE_S and pokes == []
            target[0] = (1234, REPO)  # the log says the start is downloading
            feed.collect()
            assert loop.interval == LiveFeed.DOWNLOAD_EVERY_S and pokes == [LiveFeed.DOWNLOAD_EVERY_S]
            feed.collect()
            assert len(pokes) == 1  # the same download: no second poke
            for _ in range(400):  # woken, it scans now, not at the end of its idle minute
                if scanned:
                    break
                await asyncio.sleep(0.05)
            assert scanned and scanned[0] == (1234, REPO)
            target[0] = None
            feed.collect()
            assert loop.interval == LiveFeed.DOWNLOAD_IDLE_S and len(pokes) == 1
        finally:
            feed.stop()

    asyncio.run(run())
