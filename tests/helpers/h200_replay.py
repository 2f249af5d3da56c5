"""Replay the real H200 recording (vLLM 0.26.0: startup, a 1500-request burst, a runaway)
into a running app on one clock: NVML at 5 Hz and /metrics at 1 Hz, in time order."""

from __future__ import annotations

import dataclasses
import json
import lzma
from collections.abc import Iterator
from typing import Any

from tests.conftest import FIXTURES
from vtop.clock import FakeClock
from vtop.model.gpu import GpuPoll
from vtop.sources.recording.record import polls_from_sampler
from vtop.sources.vllm import ModelsInfo, ServerPoll, poll_from_body, poll_from_error

URL = "http://127.0.0.1:8000"
LAUNCH_T = 1796032448.9186
BASE = 1000.0


def metrics_records() -> list[dict[str, Any]]:
    with lzma.open(FIXTURES / "vllm" / "h200-0.26.0-metrics-timeline.jsonl.xz", "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def timeline() -> Iterator[tuple[float, str, Any]]:
    """(t, kind, item) in time order; kind is "gpu" or "server"."""
    items: list[tuple[float, str, Any]] = []
    for p in polls_from_sampler(FIXTURES / "nvml" / "h200-vllm-0.26.0-startup-load-runaway.jsonl"):
        items.append((p.t, "gpu", p))
    for r in metrics_records():
        items.append((float(r["t"]), "server", r))
    items.sort(key=lambda x: x[0])
    return iter(items)


def mono_of(t: float) -> float:
    return BASE + (t - LAUNCH_T)


def _info() -> dict[str, Any]:
    """What /v1/models and /version answered in that run (its events.jsonl)."""
    out: dict[str, Any] = {}
    for line in (FIXTURES / "logs" / "vllm-0.26.0-h200-startup.events.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev.get("ev") == "models":
            d = ev["body"]["data"][0]
            out["models"] = ModelsInfo(ids=(d["id"],), max_model_len=d["max_model_len"], root=d.get("root"))
            out["models_t"] = ev["t"]
        elif ev.get("ev") == "version":
            out["version"] = ev["body"]["version"]
    return out


_INFO = _info()


def server_poll(r: dict[str, Any]) -> ServerPoll:
    t = float(r["t"])
    if "text" in r:
        extra: dict[str, Any] = {}
        if t >= _INFO["models_t"]:
            extra = {"models": _INFO["models"], "version": _INFO["version"], "info_polled": True,
                     "health": 200, "health_polled": True}
        return poll_from_body(URL, r["text"], t=t, mono=mono_of(t), latency_s=r.get("dt"),
                              status=int(r.get("status", 200)), **extra)
    return poll_from_error(URL, "refused", t=t, mono=mono_of(t))


async def feed(app: Any, clock: FakeClock, until_t: float, *, from_t: float = 0.0) -> None:
    """Feed everything recorded up to ``until_t`` (launch-relative seconds)."""
    entry = app.monitor.add_server(URL, from_cli=True)
    for t, kind, item in timeline():
        rel = t - LAUNCH_T
        if rel < from_t:
            continue
        if rel > until_t:
            break
        target = mono_of(t)
        if target > clock.monotonic():
            clock.advance(target - clock.monotonic())
        if kind == "gpu":
            g: GpuPoll = dataclasses.replace(item, mono=target)
            app.apply_gpu(g, {})
        else:
            app.apply_server(entry.url, server_poll(item))


def make_clock() -> FakeClock:
    return FakeClock(start=mono_of(LAUNCH_T - 5), wall_offset=LAUNCH_T - BASE)
