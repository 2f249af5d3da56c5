"""The three actions against the real vLLM CPU server: a bounded test request, a py-spy
dump of the real EngineCore, and a snapshot bundle with the real log and /metrics."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from vtop.actions.probe import fetch_models, send_test_request
from vtop.actions.pyspy import dump, pick_targets
from vtop.actions.snapshot import make_bundle
from vtop.sources.discovery import discover
from vtop.sources.http11 import HttpPool
from vtop.sources.metrics_text import parse_vllm_metrics

pytestmark = pytest.mark.real

FAKE_KEY = "sk-vtop-real-test-Hq73LxPw0Zr5Mn2K"


def _server(real_vllm):  # type: ignore[no-untyped-def]
    servers = [s for s in discover().servers if s.pid == real_vllm.pid]
    assert servers, f"discovery did not find the real server pid {real_vllm.pid}"
    return servers[0]


async def test_real_test_request_is_bounded(real_vllm) -> None:  # type: ignore[no-untyped-def]
    client = HttpPool()
    try:
        ids, mml = await fetch_models(real_vllm.url, client, FAKE_KEY)
        assert ids == [real_vllm.model] and mml == real_vllm.max_model_len
        for endpoint in ("chat", "completions"):
            r = await send_test_request(real_vllm.url, model=ids[0], endpoint=endpoint, prompt="Hello there",
                                        max_tokens=12, max_model_len=mml, api_key=FAKE_KEY, client=client,
                                        timeout_s=120)
            assert r.ok and r.kind == "ok", r.message
            assert r.finish_reason == "length" and r.output_tokens == 12 and r.tokens_from_usage
            assert r.ttft_s is not None and r.total_s is not None and 0 < r.ttft_s <= r.total_s
            assert FAKE_KEY not in repr(r)
        # a huge max_tokens is lowered below max_model_len, so vLLM does not answer 400
        r = await send_test_request(real_vllm.url, model=ids[0], endpoint="completions", prompt="Hi",
                                    max_tokens=10**6, max_model_len=mml, api_key=None, client=client,
                                    timeout_s=300)
        assert r.max_tokens_capped and r.max_tokens is not None and r.max_tokens < mml
        assert r.status == 200, r.message
        r = await send_test_request(real_vllm.url, model=ids[0], endpoint="chat", prompt="Hi", max_tokens=None,
                                    max_model_len=mml, api_key=None, client=client)
        assert r.kind == "invalid" and not r.sent
    finally:
        await client.aclose()


async def test_real_pyspy_dump_of_engine_core(real_vllm) -> None:  # type: ignore[no-untyped-def]
    engine = real_vllm.engine_pid(timeout=30)
    assert engine is not None
    srv = _server(real_vllm)
    assert [t.pid for t in pick_targets(srv)] == [engine]
    r = await dump(engine, timeout_s=60)
    assert r.ok, r.message
    assert r.process_title and "EngineCore" in r.process_title
    frames = [f for t in r.threads for f in t.frames]
    assert any(f.file.startswith("vllm/") for f in frames), r.raw[:2000]
    assert any(t.name == "MainThread" for t in r.threads)


async def test_real_snapshot_bundle(real_vllm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # a request carrying the fake key in its Authorization header (the CPU server has no --api-key: ignored)
    client = HttpPool()
    try:
        r = await send_test_request(real_vllm.url, model=real_vllm.model, endpoint="chat", prompt="snapshot me",
                                    max_tokens=4, max_model_len=real_vllm.max_model_len, api_key=FAKE_KEY,
                                    client=client)
        assert r.ok, r.message
        status, metrics = await client.get(real_vllm.url + "/metrics", limit=16 << 20, connect_timeout=30)
        assert status == 200
    finally:
        await client.aclose()
    srv = _server(real_vllm)
    calls: list[tuple[int, int]] = []
    res = make_bundle(
        tmp_path / "snaps", log_path=str(real_vllm.log_path), servers=[srv],
        metrics_texts={srv.url: metrics}, history_json={"probe": r.message}, phases_json={"ready": True},
        alerts=[], screen_svg="<svg/>", secrets=[FAKE_KEY], progress=lambda d, t: calls.append((d, t)),
    )
    assert res.ok, res.problems
    folder = res.path
    assert folder is not None and stat.S_IMODE(folder.stat().st_mode) == 0o700
    for p in folder.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        assert FAKE_KEY.encode() not in p.read_bytes(), p
    log = (folder / "vllm.log").read_text(errors="replace")
    assert "Application startup complete" in log and calls and calls[-1][0] == calls[-1][1] > 0
    (mfile,) = [p for p in folder.iterdir() if p.name.startswith("metrics-")]
    assert parse_vllm_metrics(mfile.read_bytes()).is_vllm
    procs = json.loads((folder / "processes.json").read_text())["servers"]
    assert procs[0]["pid"] == real_vllm.pid and "vllm" in procs[0]["cmdline"]
    assert any(c["role"] == "engine" for c in procs[0]["children"])
    assert isinstance(procs[0]["env"], dict)
